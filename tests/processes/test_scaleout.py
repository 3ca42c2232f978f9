"""Scale-out on loopback, with the scripts of deploy/local: several server processes behind
HAProxy (one killed in the middle of a simulator run), and a 3-node MariaDB Galera cluster
(a purchase race across its nodes, one node killed under load and rejoining).

Each setup starts once per session. They skip with a reason when haproxy or galera is
missing or cannot start, except under CI=true, where they must run (.ci/run installs them).
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from support import (
    BUMP,
    CARD,
    FAILURE_OF,
    LOGIN_FAILURE,
    Call,
    Market,
    Recorder,
    RoundTrips,
    ServerProcess,
    Shopper,
    check_books,
    codes,
    free_port,
    fresh_mysql_database,
    list_items,
    missing,
    race,
    running_market,
    sign_up,
)

from db import Database
from db.ledger import CAPTURED, Ledger
from db.migrations import make_current
from operate.audit import audit
from simulation.mixes import MIXES
from simulation.scenario import RunResult, run_once
from wire import Connection
from wire.errors import UnavailableError
from wire.ops import READ_ONLY_OPS

# Run in parallel (scripts/test.sh), these tests stay on one worker: the cluster and the
# balanced servers are started once per worker process that needs them.
pytestmark = pytest.mark.xdist_group("scaleout")

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "deploy" / "local"


def unavailable(reason: str) -> None:
    """Skip, or fail under CI=true, where the scale-out tests are required."""
    missing("the scale-out setup", reason)


def script(name: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a deploy/local script; its output is kept for the assertion messages."""
    return subprocess.run([str(SCRIPTS / name), *args], capture_output=True, text=True, timeout=timeout)


def haproxy_servers(sock_path: Path) -> dict[str, dict[str, str]]:
    """HAProxy's `show stat` over its admin socket: server name -> its columns."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(sock_path))
        sock.sendall(b"show stat\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    header, *rows = data.decode().splitlines()
    names = header.lstrip("# ").split(",")
    stats = [dict(zip(names, row.split(","), strict=False)) for row in rows if row]
    return {s["svname"]: s for s in stats if s["svname"] not in ("FRONTEND", "BACKEND")}


def wait_until(condition, seconds: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {seconds} s waiting for {what}"
        time.sleep(0.1)


# -- several server processes behind HAProxy ----------------------------------------------

@dataclass
class Balanced:
    """The servers.sh set: balancer addresses, run folder and database."""

    dir: Path
    buyer: tuple[str, int]
    seller: tuple[str, int]
    db_url: str

    def pid(self, instance: str) -> int:
        return int((self.dir / f"{instance}.pid").read_text())

    def servers(self) -> dict[str, dict[str, str]]:
        return haproxy_servers(self.dir / "haproxy.sock")


def start_servers(run_dir: Path, db_url: str, *extra: str) -> Balanced:
    """servers.sh start on free ports; skip (fail under CI) when HAProxy cannot run."""
    if not shutil.which("haproxy"):
        unavailable("haproxy is not installed (apt-get install haproxy)")
    buyer, seller = free_port(), free_port()
    started = script("servers.sh", "start", "--dir", str(run_dir), "--db-url", db_url,
                     "--buyer-port", str(buyer), "--seller-port", str(seller), *extra)
    if started.returncode != 0:
        script("servers.sh", "stop", "--dir", str(run_dir))
        unavailable(f"servers.sh start failed: {started.stderr[-800:]}")
    return Balanced(run_dir, ("127.0.0.1", buyer), ("127.0.0.1", seller), db_url)


@pytest.fixture(scope="session")
def balanced(mysql_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Balanced]:
    """Two buyer and two seller processes behind HAProxy, over a fresh MariaDB database."""
    run_dir = tmp_path_factory.mktemp("balanced")
    for db_url in fresh_mysql_database(mysql_server, "market_scaleout"):
        setup = start_servers(run_dir, db_url.replace("mysql+mysqlconnector://", "mysql://"))
        try:
            yield setup
        finally:
            stopped = script("servers.sh", "stop", "--dir", str(run_dir))
            assert stopped.returncode == 0, stopped.stderr


def test_the_balancer_spreads_connections_over_healthy_instances(balanced: Balanced) -> None:
    before = {name: int(s["stot"]) for name, s in balanced.servers().items()}
    connections = [Connection(*balanced.buyer, timeout=10) for _ in range(6)]
    try:
        for conn in connections:
            assert conn.call("ping")["server"] == "buyer"
        servers = balanced.servers()
        assert {servers[name]["status"] for name in servers} == {"UP"}
        new = {name: int(servers[name]["stot"]) - before[name] for name in ("buyer1", "buyer2")}
        assert min(new.values()) >= 2, f"connections per buyer instance: {new}"
    finally:
        for conn in connections:
            conn.close()


def test_a_start_that_fails_leaves_no_process_behind(tmp_path: Path) -> None:
    """HAProxy cannot bind (the buyer port is taken) after the instances have started: they
    used to run on, and a second start overwrote their pid files."""
    if not shutil.which("haproxy"):
        unavailable("haproxy is not installed (apt-get install haproxy)")
    db_url = f"sqlite:///{tmp_path / 'market.db'}"
    with socket.create_server(("127.0.0.1", 0)) as taken:
        started = script("servers.sh", "start", "--dir", str(tmp_path), "--db-url", db_url, "--buyers", "1",
                         "--sellers", "1", "--buyer-port", str(taken.getsockname()[1]),
                         "--seller-port", str(free_port()))
    assert started.returncode != 0 and "start failed; stopping what it started" in started.stderr
    assert (tmp_path / "buyer-1.port").exists(), "the instances had started"
    left = subprocess.run(["pgrep", "-f", "--", db_url], capture_output=True, text=True).stdout.split()
    assert left == [] and not list(tmp_path.glob("*.pid")), left


def test_stop_ends_every_process_it_started(tmp_path: Path) -> None:
    setup = start_servers(tmp_path, f"sqlite:///{tmp_path / 'market.db'}", "--buyers", "1", "--sellers", "1")
    pids = [setup.pid(name) for name in ("buyer-1", "seller-1")]
    pids.append(int((tmp_path / "haproxy.pid").read_text()))
    stopped = script("servers.sh", "stop", "--dir", str(tmp_path))
    assert stopped.returncode == 0, stopped.stderr
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    with pytest.raises(OSError):
        socket.create_connection(setup.buyer, timeout=2).close()


def simulate(buyer: tuple[str, int], seller: tuple[str, int], users: int, calls: int,
             during: threading.Event | None = None) -> RunResult:
    """run_once of the default mix; `during` is set once the users are making calls."""
    def progress(done: int) -> None:
        if during is not None and done > 0:
            during.set()

    return run_once(MIXES["default"], users, calls, buyer, seller, on_progress=progress)


def errors_by_op(result: RunResult) -> dict[str, int]:
    return {op: log.errors for op, log in result.ops.items() if log.errors}


KILL_RUN_CALLS = 1000  # per user: seconds of calls, so that the kill comes mid-run on a fast machine too


def test_an_instance_killed_mid_run_costs_no_acknowledged_purchase(balanced: Balanced) -> None:
    running = threading.Event()
    outcome: list[RunResult] = []
    sim = threading.Thread(target=lambda: outcome.append(simulate(balanced.buyer, balanced.seller, 4,
                                                                  KILL_RUN_CALLS, running)), daemon=True)
    sim.start()
    assert running.wait(60), "the simulation did not start"

    def both_busy() -> bool:  # the instances to kill are serving users of the run right now
        busy = {name: int(s["scur"]) for name, s in balanced.servers().items()}
        return busy["buyer1"] > 0 and busy["seller1"] > 0

    wait_until(both_busy, 10, "users on buyer1 and seller1")
    os.kill(balanced.pid("buyer-1"), signal.SIGKILL)
    os.kill(balanced.pid("seller-1"), signal.SIGKILL)
    wait_until(lambda: balanced.servers()["buyer1"]["status"] == "DOWN", 10, "HAProxy to mark buyer1 down")
    sim.join(240)
    assert not sim.is_alive(), "the simulation is stuck"
    result = outcome[0]
    calls = sum(len(log.latencies) + log.errors for log in result.ops.values())  # made, answered or not
    assert calls == 2 * 4 * KILL_RUN_CALLS, "every user made all its calls"
    errors = errors_by_op(result)
    kinds = Counter(result.error_kinds)
    # A repeatable call is tried again after short pauses (wire.client), long enough for
    # HAProxy to stop routing to the dead instance: none of them may fail. The simulator
    # counts each one that needed it as RESENT (the drop was real), and only those.
    resent = {kind: kinds.pop(kind) for kind in list(kinds) if kind.endswith(": RESENT")}
    safe = READ_ONLY_OPS | {"make_purchase"}
    assert {kind.split(":")[0] for kind in resent} <= safe, resent
    assert not [kind for kind in kinds if kind.split(":")[0] in safe], (
        f"calls that are safe to repeat failed: {result.error_kinds}")
    # A vote lost in flight may have been recorded. Its buyer, not having heard back, may buy
    # the item again and vote again, which is refused: at most one CONFLICT per lost vote.
    revotes = kinds.pop("provide_feedback: CONFLICT", 0)
    assert revotes <= kinds["provide_feedback: CONNECTION"], result.error_kinds
    assert set(kinds) <= {f"{op}: CONNECTION" for op in errors}, result.error_kinds
    with closing(Database(balanced.db_url, pool_size=2)) as database:
        assert audit(database, result.acknowledged) == []
    print(f"instance kill: {calls} calls, {len(result.acknowledged)} purchases acknowledged;"
          f" lost in flight: {dict(kinds)}; answered when sent again: {resent}")


# -- a 3-node Galera cluster -------------------------------------------------------------

GALERA = Path("/usr/lib/galera/libgalera_smm.so")


@dataclass
class Cluster:
    """galera.sh's cluster: the balancer on `base`, node N's SQL port base + N."""

    dir: Path
    base: int

    def url(self, port: int | None = None) -> str:
        return f"mysql+mysqlconnector://root@127.0.0.1:{port or self.base}/market"

    def node_url(self, n: int) -> str:
        return self.url(self.base + n)

    def query(self, n: int, sql: str) -> list[tuple[object, ...]]:
        engine = create_engine(self.node_url(n), pool_size=1)
        try:
            with engine.connect() as conn:
                return [tuple(row) for row in conn.execute(text(sql))]
        finally:
            engine.dispose()

    def status(self, n: int, name: str) -> int:
        return int(self.query(n, f"SHOW GLOBAL STATUS LIKE '{name}'")[0][1])  # type: ignore[call-overload]


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    """The cluster of galera.sh, started once; skip (fail under CI) when it cannot start."""
    if not GALERA.exists() or not shutil.which("haproxy") or not shutil.which("rsync"):
        unavailable("galera-4, haproxy or rsync is not installed")
    run_dir = Path(tempfile.mkdtemp(prefix="market-galera-"))  # pytest's tmp is private; mysql reads this
    setup = Cluster(run_dir, free_port(34))
    started = script("galera.sh", "start", "--dir", str(run_dir), "--base-port", str(setup.base), timeout=300)
    try:
        if started.returncode != 0:
            unavailable(f"galera.sh start failed: {started.stderr[-800:]}")
        with closing(Database(setup.url(), pool_size=1)) as database:
            make_current(database)  # each test may run alone
        yield setup
    finally:
        script("galera.sh", "stop", "--dir", str(run_dir), timeout=200)
        shutil.rmtree(run_dir, ignore_errors=True)


def conflicts_resolved(cluster: Cluster) -> int:
    """Certification failures and brute-force aborts, summed over the nodes."""
    return sum(cluster.status(n, name) for n in (1, 2, 3)
               for name in ("wsrep_local_cert_failures", "wsrep_local_bf_aborts"))


def test_a_galera_node_gets_one_statement_per_query(cluster: Cluster, round_trips: RoundTrips) -> None:
    """A replicated write can abort a node's transaction between two statements of one query,
    and the rest would then run outside it: on Galera nothing is deferred or run together."""
    name = f"galera-{random.randrange(10**9)}"
    with closing(Database(round_trips.through(cluster.node_url(1)), pool_size=1)) as database:
        assert database.run(lambda tx: tx.conn.batches, write=False) is False
        # a first write looks once whether the database keeps commit tokens (DESCRIBE)
        database.run(lambda tx: tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": f"{name}-", "n": 1}))
        round_trips.clear()
        bump = {"username": name}
        database.run(lambda tx: [tx.execute(LOGIN_FAILURE, {"role": "buyer", "username": name, "n": 1}),
                                 tx.execute(BUMP, bump), tx.execute(BUMP, bump)])
        # START TRANSACTION and the commit token with the first statement (nothing to abort
        # yet: no other node writes that token), then one each
        assert round_trips == [3, 1, 1, 1]
        assert database.run(lambda tx: tx.execute(FAILURE_OF, {"role": "buyer", "username": name}).first(),
                            write=False).failures == 3


def test_buyers_on_three_nodes_race_for_few_units_without_loss_or_overselling(cluster: Cluster) -> None:
    """Each buyer server writes to its own node, so the losers fail Galera's certification
    at commit (a deadlock error) and are retried until the stock decides."""
    seller_proc = ServerProcess("seller", cluster.node_url(1)).wait_ready()
    buyer_procs = [ServerProcess("buyer", cluster.node_url(n)).wait_ready() for n in (1, 2, 3)]
    try:
        seller = sign_up(seller_proc.connect(), "seller")
        buyers = [sign_up(buyer_procs[k % 3].connect(), "buyer") for k in range(24)]
        before = conflicts_resolved(cluster)
        for units in (6, 3, 1):
            [item_id] = list_items(seller, 1, units)
            for buyer in buyers:
                buyer.call("add_to_cart", {"item_id": item_id, "quantity": 1})
            results = race([lambda b=b: b.call("make_purchase", CARD) for b in buyers])
            assert codes(results) == {"OK": units, "CONFLICT": 24 - units}
            assert buyers[0].call("get_item", {"item_id": item_id})["quantity"] == 0
            for buyer in buyers:
                buyer.call("clear_cart")
        assert seller.call("get_seller_rating")["items_sold"] == 10
        with closing(Database(cluster.url(), pool_size=2)) as database:
            assert audit(database) == []  # the ledger against the orders too
            captured = [p for p in Ledger(database).entries() if p.state == CAPTURED]
            assert len(captured) == 10 and all(p.captures == 1 for p in captured)
        certified = conflicts_resolved(cluster) - before
        print(f"galera race: {certified} certification conflicts and brute-force aborts, all retried")
        assert certified > 0, "the race never conflicted across nodes"
    finally:
        for proc in [seller_proc, *buyer_procs]:
            proc.stop()


def test_a_database_node_killed_under_load_rejoins_with_equal_tables(cluster: Cluster) -> None:
    with closing(Database(cluster.url(), pool_size=8)) as database, running_market(database) as market:
        recorders = recording_buyers(market, 4)
        with load_from(recorders):
            time.sleep(1.5)
            killed = time.monotonic()
            assert script("galera.sh", "kill-node", "1", "--dir", str(cluster.dir)).returncode == 0
            time.sleep(4)
            rejoined = script("galera.sh", "start-node", "1", "--dir", str(cluster.dir), timeout=200)
            assert rejoined.returncode == 0, rejoined.stderr
            settled_at = max(killed + 10, time.monotonic() + 1)  # start-node returns once Synced
            wait_until(lambda: time.monotonic() > settled_at + 4, 30, "the load to run on")
        check_books(database, [r.shopper for r in recorders])
    calls = sorted((c for r in recorders for c in r.calls), key=lambda c: c.started)
    report_node_kill(calls, killed, settled_at)
    assert {cluster.status(n, "wsrep_cluster_size") for n in (1, 2, 3)} == {3}
    wait_until(lambda: len(set(table_checksums(cluster).values())) == 1, 20, "equal checksums")


def recording_buyers(market: Market, count: int) -> list[Recorder]:
    """Buyers of two well-stocked items, each call recorded; purchases wait out UNAVAILABLE."""
    seller = market.user("seller")
    items = [market.item(seller, quantity=1_000_000) for _ in range(2)]
    return [Recorder(Shopper(market.user("buyer"), items, retry_on=(UnavailableError,)))
            for _ in range(count)]


@contextmanager
def load_from(recorders: list[Recorder]) -> Iterator[None]:
    """The recorders browse and shop in threads while the block runs; joined afterwards."""
    stop = threading.Event()
    threads = [threading.Thread(target=r.browse_and_shop, args=(stop,), daemon=True) for r in recorders]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=70)
    assert not any(thread.is_alive() for thread in threads), "a client is stuck"


def report_node_kill(calls: list[Call], killed: float, settled_at: float) -> None:
    """At least 99 % of the calls made once the cluster settled succeed: from 10 s after the
    kill and 1 s after the node is Synced again (its rejoin can briefly leave the others out
    of the primary component; docs/deploy.md). Prints what was seen."""
    codes_seen = Counter(c.code for c in calls)
    assert set(codes_seen) <= {"OK", "UNAVAILABLE"}, codes_seen
    after = [c for c in calls if c.started >= settled_at]
    ok = sum(c.code == "OK" for c in after) / len(after)
    assert ok >= 0.99, f"only {ok:.1%} of the calls succeeded from {settled_at - killed:+.1f} s"
    last_failure = max((c.started - killed for c in calls if c.code != "OK"), default=0.0)
    slowest = max(c.seconds for c in calls)
    print(f"node kill: {codes_seen}; slowest call {slowest:.2f} s; last failure at {last_failure:+.2f} s;"
          f" {ok:.1%} of {len(after)} calls succeeded from {settled_at - killed:+.1f} s")


def table_checksums(cluster: Cluster) -> dict[int, tuple[object, ...]]:
    """CHECKSUM TABLE of every table of the database, per node."""
    tables = [row[0] for row in cluster.query(1, "SHOW TABLES")]
    listed = ", ".join(f"market.{name}" for name in tables)
    return {n: tuple(cluster.query(n, f"CHECKSUM TABLE {listed}")) for n in (1, 2, 3)}
