"""The operator's tools behind the `market` command, run against a database directly (no
server): `admin` (suspensions, withdrawals, the action log), `audit` (the books checked),
`purge` (test data removed), `seed` (a large catalogue loaded) and `backup` (a copy taken
and restored). They use db/ as the servers do; no server imports them.
"""
