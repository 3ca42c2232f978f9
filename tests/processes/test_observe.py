"""Metrics, logs and security events of real server processes: /metrics read over HTTP after
a known sequence of calls (one process, and --workers 2 with a worker killed), JSON log lines
parsed one by one, and no secret anywhere in them."""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from support import CARD, PASSWORD, Market, ServerProcess, child_pids, free_port, running_market, unique_name

import simulation.__main__ as sim
from buyer_server.ops import build_app as build_buyer_app
from db import Database, RetryTransaction
from db.accounts import SessionPolicy
from db.migrations import make_current
from observe import metrics
from observe.observers import LogObserver, MarketObserver
from runtime import logins as login_ops
from runtime.config import Settings
from runtime.server import Server, ServerLimits
from simulation import server_latency
from wire import Connection
from wire.errors import (
    BusyError,
    PaymentDeclinedError,
    UnauthenticatedError,
    UnavailableError,
    UnknownOpError,
)
from wire.framing import encode_frame

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    """Every sample of http://127.0.0.1:PORT/metrics, by name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def requests(samples: Samples, op: str, code: str = "OK") -> float:
    return value(samples, "market_requests_total", server="buyer", op=op, code=code)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[object]:
    started: list[ServerProcess] = []

    def start_server(*extra: str, env: dict[str, str] | None = None) -> ServerProcess:
        saved = dict(os.environ)
        os.environ.update(env or {})
        try:
            server = ServerProcess("buyer", f"sqlite:///{tmp_path / 'market.db'}", 0, *extra)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        started.append(server)
        return server.wait_ready()

    yield start_server
    for server in started:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


def known_calls(conn: Connection) -> None:
    """3 pings, an unknown op, a new account, a wrong password and a right one."""
    for _ in range(3):
        conn.call("ping")
    with pytest.raises(UnknownOpError):
        conn.call("no_such_op_" + unique_name())
    name = unique_name()
    conn.call("create_account", {"username": name, "password": PASSWORD, "name": name})
    with pytest.raises(UnauthenticatedError):
        conn.call("login", {"username": name, "password": "not the password"})
    conn.call("login", {"username": name, "password": PASSWORD})


def test_a_known_sequence_of_calls_gives_exactly_its_counts(start) -> None:  # type: ignore[no-untyped-def]
    metrics_port = free_port()
    server = start("--metrics-port", str(metrics_port))
    with server.connect() as conn:
        known_calls(conn)
        with_one_open = scrape(metrics_port)
    assert value(with_one_open, "market_connections_open", server="buyer") == 1
    deadline = time.monotonic() + 5
    while value(samples := scrape(metrics_port), "market_connections_open", server="buyer") and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert requests(samples, "ping") == 3
    assert requests(samples, "unknown", "UNKNOWN_OP") == 1  # the op's own name is no label
    assert requests(samples, "create_account") == 1
    assert requests(samples, "login", "UNAUTHENTICATED") == 1 and requests(samples, "login") == 1
    answered = sum(v for (name, _), v in samples.items() if name == "market_requests_total")
    timed = sum(v for (name, _), v in samples.items() if name == "market_request_duration_seconds_count")
    assert answered == timed == 7
    assert value(samples, "market_request_duration_seconds_count", server="buyer", op="login") == 2
    assert value(samples, "market_logins_refused_total", server="buyer", reason="wrong_credentials") == 1
    assert value(samples, "market_connections_open", server="buyer") == 0
    assert value(samples, "market_threads_busy", server="buyer") == 0
    assert value(samples, "market_requests_queued", server="buyer") == 0
    assert value(samples, "market_db_connections_in_use", server="buyer") == 0
    assert value(samples, "market_requests_total", server="buyer", op="add_to_cart", code="INTERNAL") == 0
    assert ("market_payments_total", frozenset({("server", "buyer"), ("outcome", "error")})) in samples
    assert any(name == "market_build_info" and dict(labels)["server"] == "buyer" for name, labels in samples)
    assert server.stop() == 0


def test_the_connection_limit_counts_refusals(start) -> None:  # type: ignore[no-untyped-def]
    metrics_port = free_port()
    server = start("--metrics-port", str(metrics_port), env={"MARKET_MAX_CONNECTIONS": "1"})
    with server.connect() as held:
        held.call("ping")
        with socket.create_connection((server.host, server.port), timeout=5) as refused:
            assert refused.recv(4096)  # BUSY
    samples = scrape(metrics_port)
    assert value(samples, "market_connections_refused_total", server="buyer", reason="max_connections") == 1
    assert "connection refused" in server.stderr() and "max_connections" in server.stderr()
    assert server.stop() == 0


@pytest.mark.slow
def test_workers_report_one_sum_that_survives_a_killed_worker(start) -> None:  # type: ignore[no-untyped-def]
    metrics_port = free_port()
    server = start("--workers", "2", "--metrics-port", str(metrics_port))
    for _ in range(4):  # new connections: the kernel spreads them over both workers
        with server.connect() as conn:
            known_calls(conn)
    before = scrape(metrics_port)
    assert requests(before, "ping") == 12 and requests(before, "login", "UNAUTHENTICATED") == 4
    held = [server.connect() for _ in range(12)]
    for conn in held:
        conn.call("ping")
    victim = child_pids(server.proc.pid)[0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (len(child_pids(server.proc.pid)) != 2
                                           or victim in child_pids(server.proc.pid)):
        time.sleep(0.1)
    for conn in held:
        conn.close()
    for _ in range(4):
        with server.connect() as conn:
            conn.call("ping")
    deadline = time.monotonic() + 5
    while value(after := scrape(metrics_port), "market_connections_open", server="buyer") and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    assert requests(after, "ping") == 12 + 12 + 4  # the dead worker's counts neither lost nor doubled
    assert requests(after, "create_account") == 4
    timed = sum(v for (name, _), v in after.items() if name == "market_request_duration_seconds_count")
    assert timed == 4 * 7 + 12 + 4
    assert value(after, "market_connections_open", server="buyer") == 0  # the dead worker's left the sum
    assert server.stop() == 0


SECRET_PASSWORD = "a secret password 1234"


def test_json_logs_carry_the_request_and_never_a_secret(start) -> None:  # type: ignore[no-untyped-def]
    server = start(env={"MARKET_LOG_FORMAT": "json", "MARKET_ACCESS_LOG": "on",
                        "MARKET_LOGIN_FREE_FAILURES": "1"})
    name = unique_name()
    with server.connect() as conn:
        conn.call("create_account", {"username": name, "password": SECRET_PASSWORD, "name": name})
        for _ in range(2):
            with pytest.raises(UnauthenticatedError):
                conn.call("login", {"username": name, "password": "wrong " + SECRET_PASSWORD})
        time.sleep(1.1)  # past the one free failure's pause: the next may try, and fails
        with pytest.raises(UnauthenticatedError):
            conn.call("login", {"username": name, "password": "wrong " + SECRET_PASSWORD})
    time.sleep(2.5)
    with server.connect() as conn:
        token = conn.call("login", {"username": name, "password": SECRET_PASSWORD})["token"]
        conn.token = token
        conn.call("display_cart")
        with pytest.raises(Exception):  # noqa: B017  (an empty cart: CONFLICT, after the card was read)
            conn.call("make_purchase", dict(CARD))
    with socket.create_connection((server.host, server.port), timeout=5) as bad:
        bad.sendall(b"\x00\x00\x00\x05{bad}")
        bad.recv(4096)
    assert server.stop() == 0
    log = server.stderr()
    lines = [json.loads(line) for line in log.splitlines()]  # every line one JSON object
    assert all({"time", "level", "logger", "message", "server", "pid"} <= line.keys() for line in lines)
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["time"]) for line in lines)
    accessed = [line for line in lines if line["logger"] == "market.access"]
    assert [line["op"] for line in accessed][:4] == ["create_account", "login", "login", "login"]
    assert all({"request_id", "code", "duration_ms", "client"} <= line.keys() for line in accessed)
    security = [(line["message"], line.get("username")) for line in lines
                if line["logger"] == "market.security"]
    assert ("login failed", name) in security and ("login throttled", name) in security
    assert any(message == "frame rejected" for message, _ in security)
    business = [(line["message"], line.get("username")) for line in lines
                if line["logger"] == "market.business"]
    assert business == [("signed up", name), ("logged in", name)]
    failed = next(line for line in lines if line["message"] == "login failed")
    assert failed["client"] == "127.0.0.1" and failed["op"] == "login"
    for secret in (SECRET_PASSWORD, token, CARD["card_number"], CARD["card_number"][-8:]):
        assert secret not in log


def test_the_plain_text_log_is_the_default_and_names_the_request(start) -> None:  # type: ignore[no-untyped-def]
    server = start(env={"MARKET_ACCESS_LOG": "1"})
    with server.connect() as conn:
        conn.call("ping")
    assert server.stop() == 0
    access = [line for line in server.stderr().splitlines() if "market.access" in line]
    assert len(access) == 1 and "ping OK" in access[0] and "client=127.0.0.1]" in access[0]
    assert " buyer " in access[0] and not access[0].startswith("{")


@pytest.mark.parametrize("setting", [("--log-format", "xml"), ("--metrics-port", "http"),
                                     ("MARKET_ACCESS_LOG", "lots"), ("MARKET_ACCESS_LOG", "2")])
def test_a_wrong_observing_setting_is_one_line(setting: tuple[str, str], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    name, value = setting
    if name.startswith("MARKET_"):
        monkeypatch.setenv(name, value)
    server = ServerProcess("buyer", f"sqlite:///{tmp_path / 'x.db'}", 0,
                           *(() if name.startswith("MARKET_") else setting))
    assert server.proc.wait(timeout=20) == 2
    assert value in server.stderr() and "Traceback" not in server.stderr()


def sample(name: str, **labels: str) -> float:
    """A sample of this process's own registry (the data layer's counters, in-process)."""
    return REGISTRY.get_sample_value(name, {"server": metrics.server, **labels}) or 0.0


@pytest.fixture
def metrics_served() -> Iterator[None]:
    """This process's metrics as a server with --metrics-port keeps them, until the test ends."""
    metrics.start(metrics.server, serve=True)
    yield
    metrics.start(metrics.server)


def test_a_transaction_run_again_is_counted_by_cause_and_holds_one_connection(
        database: Database, metrics_served: None) -> None:
    before = sample("market_db_retries_total", cause="conflict")
    in_use: list[float] = []

    def work(tx: object) -> int:
        in_use.append(sample("market_db_connections_in_use"))
        if len(in_use) == 1:
            raise RetryTransaction
        return 1

    idle = sample("market_db_connections_in_use")
    assert database.run(work) == 1
    assert sample("market_db_retries_total", cause="conflict") == before + 1
    assert in_use == [idle + 1, idle + 1] and sample("market_db_connections_in_use") == idle


def test_connections_in_use_are_not_counted_when_no_metrics_are_served(database: Database) -> None:
    metrics.start(metrics.server, serve=False)  # no --metrics-port: a gauge nobody reads
    idle = sample("market_db_connections_in_use")
    seen = database.run(lambda tx: sample("market_db_connections_in_use"))
    assert seen == idle


def test_refused_logins_and_sign_ups_are_counted_by_reason(database: Database) -> None:
    """Each guard before a hash counts its refusals under its own reason."""
    settings = Settings(role="buyer", hash_queue=1, signups_per_address_hour=1, login_free_failures=1,
                        login_address_free_failures=3, login_account_free_failures=100)
    guards, policy = login_ops.AccountGuards.for_settings(settings), SessionPolicy.from_settings(settings)
    def refused(metric: str, *reasons: str) -> dict[str, float]:
        return {reason: sample(f"market_{metric}_refused_total", reason=reason) for reason in reasons}

    logins = refused("logins", "wrong_credentials", "throttled", "address_throttled", "busy")
    signups = refused("signups", "address_limit", "busy")
    name, address = unique_name(), "192.0.2.1"

    def login(password: str, username: str = name) -> None:
        login_ops.login(database, "buyer", policy, guards, address, username, password)

    login_ops.create_account(database, "buyer", guards, address, name, PASSWORD, "N")
    with pytest.raises(BusyError):  # one sign-up an hour from the address
        login_ops.create_account(database, "buyer", guards, address, unique_name(), PASSWORD, "N")
    with guards.hashing.admitted():  # the queue's one place taken
        with pytest.raises(BusyError):
            login(PASSWORD)
        with pytest.raises(BusyError):
            login_ops.create_account(database, "buyer", guards, "192.0.2.2", unique_name(), PASSWORD, "N")
    with pytest.raises(UnauthenticatedError, match="wrong username"):
        login("guess")
    # the addresses refused come back in turn (runtime.hashing keeps freed places for them)
    login_ops.create_account(database, "buyer", guards, "192.0.2.2", unique_name(), PASSWORD, "N")
    with pytest.raises(UnauthenticatedError, match="for this username"):  # one free failure
        login("guess")
    with pytest.raises(UnauthenticatedError, match="wrong username"):  # another name: the third
        login("guess", unique_name())
    with pytest.raises(UnauthenticatedError, match="from your address"):
        login("guess", unique_name())
    now = refused("logins", *logins), refused("signups", *signups)
    assert {reason: now[0][reason] - logins[reason] for reason in logins} == {
        "wrong_credentials": 2, "throttled": 1, "address_throttled": 1, "busy": 1}
    assert {reason: now[1][reason] - signups[reason] for reason in signups} == {"address_limit": 1, "busy": 1}


def _buy_one(market: Market) -> None:
    seller, buyer = market.user("seller"), market.user("buyer")
    buyer.call("add_to_cart", {"item_id": market.item(seller, quantity=1), "quantity": 1})
    buyer.call("make_purchase", CARD)


@pytest.mark.parametrize(("decline_rate", "outcome"), [(0.0, "approved"), (1.0, "declined")])
def test_authorisations_are_counted_by_outcome(database: Database, decline_rate: float, outcome: str) -> None:
    before = sample("market_payments_total", outcome=outcome)
    with running_market(database, Settings(role="buyer", payment_decline_rate=decline_rate)) as market:
        try:
            _buy_one(market)
        except PaymentDeclinedError:
            assert outcome == "declined"
    assert sample("market_payments_total", outcome=outcome) == before + 1


def test_a_processor_that_fails_counts_an_error(database: Database) -> None:
    class Down:
        def authorise(self, *args: object) -> None:
            raise ConnectionError("the processor cannot be reached")

        capture = void = lookup = authorise

    before = sample("market_payments_total", outcome="error")
    with running_market(database, processor=Down()) as market, pytest.raises(UnavailableError):
        _buy_one(market)
    assert sample("market_payments_total", outcome="error") == before + 1


@contextlib.contextmanager
def observed_server(tmp_path: Path, name: str, limits: ServerLimits = ServerLimits(),
                    observer: type[LogObserver] = MarketObserver,
                    access_sample: float = 0.0) -> Iterator[Server]:
    """An in-process buyer server whose metrics carry server=`name`."""
    db = Database(f"sqlite:///{tmp_path / f'{name}.db'}", pool_size=4)
    make_current(db)
    app = build_buyer_app(Settings(role="buyer"), db)
    server = Server(app, limits=limits, observer=observer(name, app.specs, access_sample=access_sample))
    server.start()
    try:
        yield server
    finally:
        server.shutdown()
        db.close()


def test_threads_racing_are_all_counted(tmp_path: Path) -> None:
    """16 clients at once over 4 threads: every answer counted and timed once, gauges back to 0."""
    with observed_server(tmp_path, "race", ServerLimits(threads=4)) as server:
        def client(_: int) -> None:
            with Connection(*server.address, timeout=10) as conn:
                for _ in range(25):
                    conn.call("ping")
                with pytest.raises(UnknownOpError):
                    conn.call("nope")

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(client, range(16)))
        deadline = time.monotonic() + 5
        while server.connection_count and time.monotonic() < deadline:
            time.sleep(0.02)
    assert sample("market_requests_total", server="race", op="ping", code="OK") == 16 * 25
    assert sample("market_requests_total", server="race", op="unknown", code="UNKNOWN_OP") == 16
    assert sample("market_request_duration_seconds_count", server="race", op="ping") == 16 * 25
    for gauge in ("market_connections_open", "market_threads_busy", "market_requests_queued"):
        assert sample(gauge, server="race") == 0, gauge


def test_market_sim_reports_the_servers_latency_next_to_the_clients(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db_url = f"sqlite:///{tmp_path / 'sim.db'}"
    ports = {role: free_port() for role in ("buyer", "seller")}
    servers = {role: ServerProcess(role, db_url, 0, "--metrics-port", str(ports[role])).wait_ready()
               for role in ("buyer", "seller")}
    try:
        code = sim.main(["--users", "1", "--calls", "30", "--repeats", "1", "--no-progress",
                         "--buyer", f"127.0.0.1:{servers['buyer'].port}",
                         "--seller", f"127.0.0.1:{servers['seller'].port}", "--db-url", db_url,
                         "--allow-live", "--out", str(tmp_path / "out"),
                         "--metrics", f"127.0.0.1:{ports['buyer']},127.0.0.1:{ports['seller']}"])
    finally:
        for server in servers.values():
            server.stop()
    assert code == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "server p50" in line)
    rows = out[out.index(header):].splitlines()[1:]
    measured = [row.split() for row in rows if row.startswith("  ") and len(row.split()) == 5]
    assert measured, out
    for op, *figures in measured:
        assert all(not math.isnan(float(figure)) for figure in figures), (op, figures)


def test_a_histograms_quantile_is_interpolated_within_its_bucket() -> None:
    buckets = {0.001: 50.0, 0.01: 90.0, 0.1: 100.0, math.inf: 100.0}
    assert server_latency.quantile(buckets, 0.5) == pytest.approx(0.001)
    assert server_latency.quantile(buckets, 0.7) == pytest.approx(0.001 + 0.009 * 0.5)
    assert server_latency.quantile(buckets, 0.99) == pytest.approx(0.01 + 0.09 * 0.9)
    assert math.isnan(server_latency.quantile({0.1: 0.0, math.inf: 0.0}, 0.5))
    assert server_latency.quantile({0.1: 0.0, math.inf: 4.0}, 0.5) == 0.1  # past the last bound
    before = {"ping": {0.001: 5.0, math.inf: 6.0}}
    after = {"ping": {0.001: 7.0, math.inf: 9.0}, "login": {0.001: 1.0, math.inf: 1.0}}
    assert server_latency.during(before, after) == {"ping": {0.001: 2.0, math.inf: 3.0},
                                                    "login": {0.001: 1.0, math.inf: 1.0}}


def test_a_storm_of_refused_connections_is_all_counted_but_logged_a_line_a_second(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with observed_server(tmp_path, "storm", ServerLimits(max_connections=1)) as server:
        started = time.monotonic()
        with caplog.at_level("WARNING", logger="market.security"), Connection(*server.address) as held:
            held.call("ping")
            for _ in range(30):
                with socket.create_connection(server.address, timeout=5) as refused:
                    refused.recv(4096)  # BUSY, then closed
            time.sleep(1.1)
            held.call("ping")  # active, so it does not give way to the newcomer (runtime.admission)
            with socket.create_connection(server.address, timeout=5) as refused:
                refused.recv(4096)
        took = time.monotonic() - started
    assert sample("market_connections_refused_total", server="storm", reason="max_connections") == 31
    lines = [record for record in caplog.records if record.getMessage() == "connection refused"]
    events = [line.events for line in lines]  # type: ignore[attr-defined]
    assert events[0] == 1 and sum(events) == 31  # the last line, a second on, tells of those held back
    assert 2 <= len(lines) <= took + 1


@pytest.mark.parametrize("op", [["a", "list"], {"a": "dict"}, None, 7])
def test_an_op_that_is_no_name_is_answered_and_counted_as_unknown(tmp_path: Path, op: object) -> None:
    with observed_server(tmp_path, f"odd{abs(hash(str(op)))}", ServerLimits()) as server, \
            socket.create_connection(server.address, timeout=5) as sock:
        sock.sendall(encode_frame({"id": 1, "op": op}))
        answer = sock.recv(4096)
        name = server.observer.server  # type: ignore[attr-defined]
    assert b"BAD_REQUEST" in answer
    assert sample("market_requests_total", server=name, op="unknown", code="BAD_REQUEST") == 1


def test_a_hostile_request_id_is_cut_short_and_printable_in_the_access_log(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with observed_server(tmp_path, "ids", observer=LogObserver, access_sample=1.0) as server, \
            caplog.at_level("INFO", logger="market.access"), \
            socket.create_connection(server.address, timeout=5) as sock:
        sock.sendall(encode_frame({"id": "x\nFAKE LINE " + "y" * 5000, "op": "ping"}))
        assert b"FAKE LINE" in sock.recv(65536)  # the answer carries the id back whole
        deadline = time.monotonic() + 5
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.02)
    logged = caplog.records[0].request_id  # type: ignore[attr-defined]
    assert len(logged) <= 64 and "\n" not in logged and logged.startswith("'x\\nFAKE LINE")


def test_market_serve_gives_each_server_its_metrics_port(tmp_path: Path) -> None:
    """`market serve --metrics-port P`: the buyer's /metrics on P, the seller's on P+1, each
    series labelled with its server and there from the start."""
    buyer_port, seller_port, metrics_port = free_port(), free_port(), free_port()
    while not _free(metrics_port + 1):
        metrics_port = free_port()
    serve = subprocess.Popen([sys.executable, "-m", "client.main", "serve", "--db-url",
                              f"sqlite:///{tmp_path / 'served.db'}", "--buyer-port", str(buyer_port),
                              "--seller-port", str(seller_port), "--metrics-port", str(metrics_port)],
                             stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "MARKET_UPGRADE_SCHEMA": "1"})
    try:
        found = {role: _scrape_when_up(serve, port) for role, port in
                 (("buyer", metrics_port), ("seller", metrics_port + 1))}
        serve.send_signal(signal.SIGINT)
        _, err = serve.communicate(timeout=30)
    finally:
        serve.kill()
    assert serve.returncode == 0, err[-3000:]
    for role, samples in found.items():
        servers = {dict(labels).get("server") for (name, labels) in samples if name.startswith("market_")}
        assert servers == {role}
        assert value(samples, "market_requests_total", server=role, op="ping", code="OK") == 0
        for name, labels in (("market_requests_total", {"op": "ping", "code": "INTERNAL"}),
                             ("market_logins_refused_total", {"reason": "throttled"})):
            assert (name, frozenset({"server": role, **labels}.items())) in samples


def _free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def _scrape_when_up(serve: subprocess.Popen[str], port: int) -> Samples:
    deadline = time.monotonic() + 60
    while True:
        try:
            return scrape(port)
        except OSError:
            assert serve.poll() is None and time.monotonic() < deadline, "market serve did not serve /metrics"
            time.sleep(0.2)
