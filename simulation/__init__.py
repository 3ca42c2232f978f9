"""Load for the marketplace, and the measuring tools built on it.

The simulator's core drives the real servers over the wire protocol: `behaviour` (what a
simulated buyer or seller does next), `mixes` (the ops each draws), `scenario` (one run of
N + N users), `series` (every scenario of a plan, each run audited), `stats` and `report`
(summaries, tables and plots), `servers` (starting and stopping the servers). The tools share
it, and each other, through public functions only.

Entry points, one command each:
- `market-sim`: scenarios of N sellers + N buyers, repeated, reported and audited.
- `python -m simulation.targets`: every performance target, in interleaved rounds.
- `python -m simulation.catalogue`: read latency as the catalogue grows.
- `python -m simulation.storms`: abusive clients against the servers while users shop.
- `python -m simulation.chaos`: purchases while the buyer server is killed; the books audited.
- `python -m simulation.idle`: many idle connections held open against running servers.
- `python -m simulation.idle_cost`: what those idle connections cost the busy ones.
- `python -m simulation.scaleout`: server processes behind HAProxy, one MariaDB against Galera.
- `python -m simulation.tail`: where each call's time went, from per-request timestamps.
- `python -m simulation.opcost`: each op's CPU per call, in-process, on one thread.
- `python -m simulation.loop_cost`: the server loop's CPU per request, of one checkout or several.
- `python -m simulation.studies.threads`: server threads against clients.
- `python -m simulation.studies.remote_db`: a database a network hop away.
- `python -m simulation.studies.delay_proxy`: the delaying TCP proxy that study runs.
- `python -m simulation.studies.checkouts`: this checkout against another, taking turns.
- `locust -f simulation/locustfile.py`: the same simulated users under locust.
"""
