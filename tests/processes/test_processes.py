"""The servers as real processes: the `listening on` line, SIGTERM, and statelessness
(any process of a kind accepts any live token; a restart keeps sessions).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest
from support import (
    LISTENING,
    PASSWORD,
    ServerProcess,
    a_frozen_worker_is_replaced,
    child_pids,
    free_port,
    read_messages,
    unique_name,
)

from db import Database
from db.engine import driver_url
from db.migrations import make_current
from wire import Connection
from wire.errors import UnauthenticatedError
from wire.framing import encode_frame


def _spawner(db_url: str) -> Iterator[object]:
    started: list[ServerProcess] = []

    def start(role: str = "buyer", port: int = 0, ready: bool = True, *extra: str) -> ServerProcess:
        server = ServerProcess(role, db_url, port, *extra)
        started.append(server)
        return server.wait_ready() if ready else server

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


@pytest.fixture
def spawn(database: Database) -> Iterator[object]:
    """Servers over a database already at head (on MariaDB, migrating one takes seconds)."""
    yield from _spawner(database.url)


@pytest.fixture
def spawn_new(db_url: str) -> Iterator[object]:
    """Servers over an empty database, which the first of them makes current."""
    yield from _spawner(db_url)


def login(conn: Connection) -> str:
    name = unique_name()
    conn.call("create_account", {"username": name, "password": PASSWORD, "name": name})
    return str(conn.call("login", {"username": name, "password": PASSWORD})["token"])


def test_a_server_prints_its_port_and_stops_cleanly_on_sigterm(spawn) -> None:  # type: ignore[no-untyped-def]
    server = spawn("seller")
    assert server.host == "127.0.0.1" and server.port > 0
    assert server.connect().call("ping")["server"] == "seller"
    assert server.stop() == 0


def test_two_buyer_processes_accept_each_others_tokens(spawn) -> None:  # type: ignore[no-untyped-def]
    first, second = spawn("buyer"), spawn("buyer")
    one, two = first.connect(), second.connect()
    token = login(one)
    assert two.call("display_cart", token=token)["cart"]["total"] == "0.00"
    two.call("logout", token=token)
    with pytest.raises(UnauthenticatedError):
        one.call("display_cart", token=token)


def test_a_restarted_server_still_accepts_live_tokens(spawn) -> None:  # type: ignore[no-untyped-def]
    server = spawn("buyer")
    conn = server.connect()
    token = login(conn)
    assert server.stop() == 0
    restarted = spawn("buyer", port=server.port)
    assert conn.call("display_cart", token=token)["cart"]["items"] == []
    assert conn.reconnects == 1
    assert restarted.stop() == 0


def test_servers_starting_together_on_a_new_database_all_come_up(spawn_new) -> None:  # type: ignore[no-untyped-def]
    servers = [spawn_new(role, ready=False) for role in ("buyer", "seller", "buyer", "seller")]
    for server in servers:
        assert server.wait_ready().connect().call("ping")["server"] in ("buyer", "seller")
    token = login(servers[0].connect())
    assert servers[2].connect().call("display_cart", token=token)["cart"]["items"] == []


def test_settings_come_from_a_dot_env_file_in_the_working_folder(tmp_path) -> None:  # type: ignore[no-untyped-def]
    db_file = tmp_path / "from-dotenv.db"
    (tmp_path / ".env").write_text(f"MARKET_DB_URL=sqlite:///{db_file}\nMARKET_SELLER_PORT=0\n"
                                      "MARKET_UPGRADE_SCHEMA=1\n")
    proc = subprocess.Popen([sys.executable, "-m", "seller_server"], cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True,
                            env={k: v for k, v in os.environ.items() if not k.startswith("MARKET_")})
    try:
        assert proc.stdout is not None
        match = LISTENING.match(proc.stdout.readline().strip())
        assert match and int(match.group(2)) != 7002
        assert db_file.exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return True
    except OSError:
        return False


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_server_stopped_the_moment_it_answers_stops_cleanly(workers: str, tmp_path: Path) -> None:
    # before: the port answered before the handlers were in place, and SIGTERM killed the
    # process there (exit status -15; in every one of 20 tries, `market serve`'s flaky Ctrl-C test):
    # one try shows it
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "buyer_server", "--port", str(port),
                             "--workers", workers, "--db-url", f"sqlite:///{tmp_path / 'market.db'}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not _answers(port):
            assert proc.poll() is None and time.monotonic() < deadline
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_server_stopped_while_it_waits_for_its_database_stops_cleanly(workers: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent_database:  # accepts, never answers
        port = silent_database.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "buyer_server", "--port", "0", "--workers", workers,
                                 "--db-url", f"mysql://root@127.0.0.1:{port}/market?connect_timeout=1"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        silent_database.settimeout(30)
        waiting, _ = silent_database.accept()  # the server is inside its start-up, waiting for it
        try:
            proc.send_signal(signal.SIGINT)  # handled once the driver's connect returns (its 1 s timeout)
            out, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
            waiting.close()
    assert proc.returncode == 0, err[-2000:]  # before: a KeyboardInterrupt traceback, exit status 1
    assert out == "" and "Traceback" not in err and "error" not in err


def _start_failing(role: str, db_url: str, *extra: str, port: int = 0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", f"{role}_server", "--port", str(port), "--db-url", db_url,
                           *extra], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("role", ["buyer", "seller"])
def test_a_server_whose_database_cannot_be_opened_says_why_in_one_line(role: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'no such folder' / 'market.db'}"
    done = _start_failing(role, url)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"error: {role} server: cannot use the database {url}: "
                                        "unable to open database file"]
    assert done.stdout == ""


def test_a_server_with_no_database_server_there_says_so_in_one_line() -> None:
    done = _start_failing("buyer", "mysql://root:secret@127.0.0.1:1/market")
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith("error: buyer server: cannot use the database "
                           "mysql://root:***@127.0.0.1:1/market: 2003 (HY000): Can't connect")
    assert "secret" not in done.stderr


def test_a_database_server_that_never_answers_is_reported_in_one_line_after_the_timeout() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, and never says a word
        url = f"mysql://root@127.0.0.1:{silent.getsockname()[1]}/market?connect_timeout=1"  # 5 s by default
        started = time.monotonic()
        done = _start_failing("buyer", url)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith(f"error: buyer server: cannot use the database {url}: ")
    assert line.endswith("(no answer within the 1 s connect timeout)")
    assert time.monotonic() - started >= 1  # waited for it


def test_a_missing_mariadb_database_is_named_with_the_statement_that_makes_it(mysql_server: str) -> None:
    url = driver_url(mysql_server).set(database="market_nowhere_x").render_as_string(hide_password=False)
    done = _start_failing("seller", url)
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert "Unknown database 'market_nowhere_x'" in line
    assert line.endswith("create it first: CREATE DATABASE market_nowhere_x "
                         "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")


def test_seed_says_in_one_line_when_it_cannot_use_the_database(capsys: pytest.CaptureFixture[str],
                                                                tmp_path: Path) -> None:
    from client.main import main

    url = f"sqlite:///{tmp_path / 'missing' / 'big.db'}"
    assert main(["seed", "--db-url", url, "--sellers", "1", "--items", "1"]) == 2
    assert capsys.readouterr().err == f"error: cannot use the database {url}: unable to open database file\n"


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_server_whose_port_is_taken_says_so_in_one_line(workers: str, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = _start_failing("buyer", f"sqlite:///{tmp_path / 'market.db'}", "--workers", workers, port=port)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"error: buyer server: cannot listen on 127.0.0.1:{port}: "
                                        "Address already in use"]


def test_an_unreachable_database_answers_unavailable() -> None:
    from runtime.config import Settings
    from runtime.server import Server
    from seller_server.ops import build_app
    from wire.errors import UnavailableError

    server = Server(build_app(Settings(role="seller"), Database("mysql://root@127.0.0.1:1/none")))
    server.start()
    try:
        conn = Connection(*server.address)
        with pytest.raises(UnavailableError) as caught:
            conn.call("login", {"username": "somebody", "password": PASSWORD})
        assert caught.value.retryable
        with pytest.raises(UnavailableError):
            conn.call("display_items", token="x" * 43)
        assert conn.call("ping")["server"] == "seller"
    finally:
        server.shutdown()


def test_workers_share_the_port_and_a_dead_worker_is_replaced(spawn) -> None:  # type: ignore[no-untyped-def]
    server = spawn("buyer", 0, True, "--workers", "2")
    workers = child_pids(server.proc.pid)
    assert len(workers) == 2
    token = login(server.connect())
    conns = [server.connect() for _ in range(20)]
    assert all(c.call("display_cart", token=token)["cart"]["items"] == [] for c in conns)
    os.kill(workers[0], signal.SIGKILL)
    deadline = time.monotonic() + 10
    children = child_pids(server.proc.pid)
    while time.monotonic() < deadline and (len(children) != 2 or workers[0] in children):
        time.sleep(0.1)
        children = child_pids(server.proc.pid)
    assert len(children) == 2 and workers[0] not in children, (workers, children)
    assert all(server.connect().call("ping")["server"] == "buyer" for _ in range(10))
    assert server.stop() == 0
    assert child_pids(server.proc.pid) == []


def test_a_supervisor_stops_on_a_sigterm_that_lands_on_another_of_its_threads(spawn) -> None:  # type: ignore[no-untyped-def]
    # before: the supervisor waited for its workers in a blocking os.wait() on its main thread;
    # a SIGTERM the kernel handed to one of its other threads (or one that came just before
    # the wait) was handled only once a worker ended, which none did: a CI run's stop hung
    if _SYS_TGKILL is None:
        pytest.skip(f"tgkill's system call number on {platform.machine()} is not known here")
    server = spawn("buyer", 0, True, "--workers", "2")
    assert server.connect().call("ping")["server"] == "buyer"
    others = [tid for tid in os.listdir(f"/proc/{server.proc.pid}/task") if int(tid) != server.proc.pid]
    assert others, "the supervisor runs its health checks on threads of their own"
    _signal_thread(server.proc.pid, int(others[0]), signal.SIGTERM)
    assert server.proc.wait(timeout=10) == 0
    assert child_pids(server.proc.pid) == []


def _signal_thread(pid: int, tid: int, signum: int) -> None:
    """tgkill(2): a signal to one thread of a process, as the kernel may deliver one."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_SYS_TGKILL, pid, tid, signum) != 0:  # the number is known: the test skips otherwise
        raise OSError(ctypes.get_errno(), f"tgkill {pid} {tid}")


_SYS_TGKILL = {"x86_64": 234, "aarch64": 131}.get(platform.machine())


def test_workers_stop_when_their_supervisor_is_killed(spawn) -> None:  # type: ignore[no-untyped-def]
    server = spawn("buyer", 0, True, "--workers", "2")
    workers = child_pids(server.proc.pid)
    assert len(workers) == 2
    server.proc.kill()
    server.proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in workers):
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in workers)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--threads", "0"], {}, "--threads / MARKET_THREADS 0: must be from 1 to 1,024"),
    (["--workers", "0"], {}, "--workers / MARKET_WORKERS 0: must be from 1 to 256"),
    (["--log-level", "loud"], {}, "--log-level loud: one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
    ([], {"MARKET_THREADS": "many"}, "MARKET_THREADS=many: not an integer"),
    ([], {"MARKET_PAYMENT_DECLINE_RATE": "2"}, "MARKET_PAYMENT_DECLINE_RATE 2.0: must be from 0 to 1"),
    ([], {"MARKET_IDLE_TIMEOUT_S": "0"}, "MARKET_IDLE_TIMEOUT_S 0.0: must be from 0.001 to 1,000,000,000"),
    ([], {"MARKET_SQLITE_SYNCHRONOUS": "off"}, "--sqlite-synchronous off: one of NORMAL, FULL"),
    ([], {"MARKET_MAX_CONNECTIONS_PER_ADDRESS": "0"},
     "MARKET_MAX_CONNECTIONS_PER_ADDRESS 0: must be from 1 to 1,000,000"),
    ([], {"MARKET_MAX_QUEUED_BYTES": "10"},
     "MARKET_MAX_QUEUED_BYTES 10: must be from 1,024 to 1,099,511,627,776"),
])
def test_a_setting_out_of_range_is_refused_in_one_line(args: list[str], env: dict[str, str], message: str,
                                                       tmp_path: Path) -> None:
    # before: --threads 0 listened and never answered, nor stopped on SIGTERM; the others were tracebacks
    done = subprocess.run([sys.executable, "-m", "buyer_server", "--port", "0", "--db-url",
                           f"sqlite:///{tmp_path / 'market.db'}", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env}, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"error: buyer server: {message}"]
    assert done.stdout == ""


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_missing_tls_certificate_is_named_in_one_line(workers: str, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    done = _start_failing("seller", f"sqlite:///{tmp_path / 'market.db'}", "--workers", workers,
                          "--tls-cert", str(cert), "--tls-key", str(key))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"error: seller server: cannot use the TLS certificate {cert} "
                                        f"and key {key}: No such file or directory"]
    assert done.stdout == ""


FAILING_WORKER = """
import sqlite3
import sys
from runtime import runner

def build_app(settings, database):
    raise RuntimeError("no app today")

sys.exit(runner.main("buyer", build_app, sys.argv[1:]))
"""


def test_a_worker_that_dies_before_listening_fails_the_start(tmp_path: Path) -> None:
    # before: the supervisor took its death for readiness, printed `listening on` and forked
    # a new worker every half second, forever
    done = subprocess.run([sys.executable, "-c", FAILING_WORKER, "--port", "0", "--workers", "2",
                           "--db-url", f"sqlite:///{tmp_path / 'market.db'}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "listening on" not in done.stdout
    assert "RuntimeError: no app today" in done.stderr
    assert done.stderr.splitlines()[-1] == "error: buyer server: a worker process could not start " \
                                           "(its error is above)"


def test_clients_wait_instead_of_being_refused_while_every_worker_is_replaced(spawn) -> None:  # type: ignore[no-untyped-def]
    # before: the supervisor held the port bound but not listening, so with every worker dead
    # a client was refused (ECONNREFUSED) until a replacement listened, after pauses up to 30 s
    server = spawn("buyer", 0, True, "--workers", "2")
    for pid in child_pids(server.proc.pid):
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.05)  # both dead, the replacements not yet listening
    client = Connection("127.0.0.1", server.port, timeout=30)  # in the backlog, not refused
    assert client.call("ping")["server"] == "buyer"
    with pytest.raises(OSError, match="Address already in use"):
        socket.create_server(("127.0.0.1", server.port)).close()
    client.close()
    assert server.stop() == 0, server.stderr()
    assert re.search(r"worker \d+ was killed by SIGKILL after [\d.]+ s; starting another in 0\.1 s",
                     server.stderr()), server.stderr()


def _listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` holds a listening socket on (from /proc)."""
    inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[len("socket:["):-1] for fd in os.listdir(f"/proc/{pid}/fd")
              if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_the_supervisor_listens_on_the_market_port_alone(spawn) -> None:  # type: ignore[no-untyped-def]
    # before: a private health port on loopback, where any local process could name any PID
    # and have the supervisor SIGKILL it; now the checks go over socket pairs made at the fork
    server = spawn("buyer", 0, True, "--workers", "2")
    assert _listening_ports(server.proc.pid) == {server.port}
    assert server.connect().call("ping")["server"] == "buyer"
    assert server.stop() == 0


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["single", "workers"])
def test_hup_usr1_and_usr2_leave_a_server_serving_and_quit_stops_it_gracefully(
        workers: list[str], tmp_path: Path) -> None:
    # before: each of SIGHUP (logrotate's), SIGUSR1, SIGUSR2 and SIGQUIT ended the process at once
    server = ServerProcess("buyer", f"sqlite:///{tmp_path / 'market.db'}", 0, *workers).wait_ready()
    try:
        before = child_pids(server.proc.pid)
        for signum in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
            server.proc.send_signal(signum)
            for pid in before:
                os.kill(pid, signum)
            assert server.connect().call("ping")["server"] == "buyer"
        assert server.proc.poll() is None and child_pids(server.proc.pid) == before
        server.proc.send_signal(signal.SIGQUIT)
        assert server.proc.wait(timeout=30) == 0, server.stderr()
        assert "signal 3: stopping" in server.stderr()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()


DYING_WORKERS = """
import os, sys
from buyer_server.ops import build_app as buyer_app
from runtime import runner, supervisor

supervisor.FIRST_PAUSE_S = {first_pause}

def build_app(settings, database):
    if os.path.exists({marker!r}):
        raise RuntimeError("no app today")
    return buyer_app(settings, database)

sys.exit(runner.main("buyer", build_app, sys.argv[1:]))
"""


def _dying_workers(tmp_path: Path, first_pause: float) -> tuple[subprocess.Popen[str], Path]:
    marker = tmp_path / "workers die from now on"
    script = DYING_WORKERS.format(first_pause=first_pause, marker=str(marker))
    proc = subprocess.Popen([sys.executable, "-c", script, "--port", "0", "--workers", "2",
                             "--db-url", f"sqlite:///{tmp_path / 'market.db'}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and LISTENING.match(proc.stdout.readline().strip())
    return proc, marker


def test_workers_that_keep_dying_are_restarted_ever_later_then_given_up(tmp_path: Path) -> None:
    # before: a new worker every 0.5 s, forever, and a supervisor alive as if all were well
    proc, marker = _dying_workers(tmp_path, first_pause=0.1)
    try:
        marker.touch()
        for pid in child_pids(proc.pid):
            os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 2, err[-3000:]
    assert err.splitlines()[-1] == "error: buyer server: 5 workers started in a row died before they " \
                                   "listened (their errors are above)"
    pauses = [float(p) for p in re.findall(r"starting another in ([\d.]+) s", err)]
    assert pauses == [0.1, 0.2, 0.4, 0.8, 1.6], err[-3000:]  # one per start that failed


def test_a_stop_during_a_workers_restart_pause_starts_no_worker(tmp_path: Path) -> None:
    # before: the supervisor slept its pause through and then started a worker, to stop it
    proc, _ = _dying_workers(tmp_path, first_pause=5.0)
    try:
        first, second = child_pids(proc.pid)
        os.kill(first, signal.SIGKILL)
        time.sleep(0.3)  # the supervisor is in its pause
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    stopped = set(re.findall(r"buyer (\d+) INFO market.server: signal 15: stopping", err))
    assert stopped == {str(second)}, err[-3000:]  # the worker left, and no new one


HELD_REPLACEMENT = """
import os, sys, time
from buyer_server.ops import build_app as buyer_app
from runtime import runner, supervisor

supervisor.FIRST_PAUSE_S = 0.1

def build_app(settings, database):
    if os.path.exists({hold!r}):  # a replacement: it starts once the test lets it
        open({held!r}, "w").close()
        while not os.path.exists({release!r}):
            time.sleep(0.02)
    return buyer_app(settings, database)

sys.exit(runner.main("buyer", build_app, sys.argv[1:]))
"""


@pytest.mark.parametrize(("refuses", "dying", "status"),
                         [(False, False, 0), (False, True, 0), (True, False, 1)],
                         ids=["all-stop", "still-dying", "one-refuses"])
def test_a_worker_already_dead_but_not_waited_for_at_a_stop_does_not_fail_it(
        refuses: bool, dying: bool, status: int, tmp_path: Path) -> None:
    # before: a worker killed just before the stop, while the supervisor waited for a replacement
    # to listen (so could not wait for the dead one), was counted as failing to stop: exit 1.
    # Here the replacement is held in its start until the stop has come; a worker that was
    # alive at the stop and then does not stop (frozen, killed later) still fails it.
    hold, held, release = (tmp_path / name for name in ("hold", "held", "release"))
    script = HELD_REPLACEMENT.format(hold=str(hold), held=str(held), release=str(release))
    log = (tmp_path / "stderr.log").open("w+")
    proc = subprocess.Popen([sys.executable, "-c", script, "--port", "0", "--workers", "3",
                             "--db-url", f"sqlite:///{tmp_path / 'market.db'}"],
                            stdout=subprocess.PIPE, stderr=log, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout is not None and LISTENING.match(proc.stdout.readline().strip())
        first, dead, other = child_pids(proc.pid)
        hold.touch()
        os.kill(first, signal.SIGKILL)
        _wait_for(held.exists, log)  # the replacement starts: the supervisor waits for it to listen
        if refuses:
            os.kill(other, signal.SIGSTOP)  # it will not act on a SIGTERM
        os.kill(dead, signal.SIGKILL)
        # dead, and not waited for: the supervisor is busy; or still dying (its main thread a
        # zombie, its other threads not yet gone: no wait would find it for a few ms)
        _wait_for(lambda: _main_thread_ended(dead) if dying else _ended(dead), log)
        proc.send_signal(signal.SIGTERM)
        _wait_for(lambda: not _signal_pending(proc.pid, signal.SIGTERM), log)
        release.touch()  # the stop's handler runs before the supervisor waits for the dead worker
        if refuses:
            _wait_for(lambda: "signal 15: stopping 2 workers" in _read(log), log)
            _wait_for(lambda: child_pids(proc.pid) == [other], log)  # the others have stopped
            os.kill(other, signal.SIGKILL)  # as a stop's timeout would (systemd's, say)
        assert proc.wait(timeout=20) == status, _read(log)[-3000:]
    finally:
        release.touch()
        for pid in child_pids(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        proc.wait()
        err = _read(log)
        log.close()
    assert "signal 15: stopping 2 workers" in err, err[-3000:]  # the dead one among them
    assert f"worker {first} was killed by SIGKILL" in err, err[-3000:]
    assert f"worker {dead} was killed" not in err, err[-3000:]  # waited for only after the stop
    assert "Traceback" not in err


def _wait_for(condition: Callable[[], bool], log: IO[str]) -> None:
    deadline = time.monotonic() + 20
    while not condition():
        assert time.monotonic() < deadline, _read(log)[-3000:]
        time.sleep(0.02)


def _read(log: IO[str]) -> str:
    log.seek(0)
    return log.read()


def _ended(pid: int) -> bool:
    """Whether the process has ended and can be waited for: its main thread a zombie (there
    until its parent waits for it), and its other threads gone (they take a few ms more after
    a SIGKILL, during which its parent's wait finds nothing yet)."""
    return _main_thread_ended(pid) and os.listdir(f"/proc/{pid}/task") == [str(pid)]


def _main_thread_ended(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] == "Z"


def _signal_pending(pid: int, signum: int) -> bool:
    """Whether a signal sent to the process has reached none of its threads yet."""
    with open(f"/proc/{pid}/status") as status:
        pending = next(line.split()[1] for line in status if line.startswith("ShdPnd:"))
    return bool(int(pending, 16) & (1 << (signum - 1)))


@pytest.mark.parametrize("role", ["buyer", "seller"])
def test_health_ready_says_whether_the_server_reaches_its_database(
        role: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # before: health only pinged, and a server whose database was down passed every check
    from client.main import main
    from runtime.config import Settings
    from runtime.server import Server

    build_app = __import__(f"{role}_server.ops", fromlist=["build_app"]).build_app
    database = Database(f"sqlite:///{tmp_path / 'up.db'}", pool_size=2)
    make_current(database)
    for db, ready in ((database, True), (Database("mysql://root@127.0.0.1:1/none"), False)):
        server = Server(build_app(Settings(role=role), db))
        server.start()
        address = "{}:{}".format(*server.address)
        try:
            assert main(["health", address]) == 0  # it answers a ping either way
            assert main(["health", address, "--ready"]) == (0 if ready else 1)
        finally:
            server.shutdown()
            db.close()
        out, err = capsys.readouterr()
        if ready:
            assert f"ok: {role} server" in out and "(its database answers)" in out and err == ""
        else:
            assert re.fullmatch(rf"unhealthy: {re.escape(address)}: the database cannot be reached; nothing "
                                r"was changed \(request [0-9a-f]{16}\)\n", err), err  # the server's id


HANDLERS_BEFORE_SQLALCHEMY = """
import signal, sys

class FirstSqlalchemyImport:
    def find_spec(self, name, path=None, target=None):
        if name == "sqlalchemy":
            sys.meta_path.remove(self)
            handled = signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
            print("SIGTERM handled" if handled else "SIGTERM not handled", flush=True)
        return None

sys.meta_path.insert(0, FirstSqlalchemyImport())
from {role}_server.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("role", ["buyer", "seller"])
def test_stop_signals_are_handled_before_the_slow_imports_of_a_start(role: str, tmp_path: Path) -> None:
    # before: the ops and SQLAlchemy were imported first, about 0.3 s of every start during
    # which SIGTERM killed the server (-15) and Ctrl-C printed a traceback
    done = subprocess.run([sys.executable, "-c", HANDLERS_BEFORE_SQLALCHEMY.format(role=role), "--port", "0",
                           "--db-url", f"sqlite:///{tmp_path / 'no such folder' / 'market.db'}"],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines()[0] == "SIGTERM handled", done.stdout + done.stderr
    assert done.returncode == 2  # and then it went on as before: this database cannot be opened


def test_workers_start_on_a_port_a_single_server_has_just_left(tmp_path: Path) -> None:
    # before: the single server's connections, left in TIME_WAIT without SO_REUSEPORT, kept
    # `--workers 2` off the port for a minute: "Address already in use", exit 2
    port, db_url = free_port(), f"sqlite:///{tmp_path / 'market.db'}"
    single = ServerProcess("buyer", db_url, port).wait_ready()
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
    assert single.connect().call("ping")["server"] == "buyer"
    assert single.stop() == 0  # the server closes the connections first: its side waits
    for client in clients:
        client.close()
    workers = ServerProcess("buyer", db_url, port, "--workers", "2")
    try:
        assert workers.wait_ready().port == port, workers.stderr()
        assert workers.connect().call("ping")["server"] == "buyer"
        assert workers.stop() == 0
    finally:
        workers.proc.kill()


FORK_FAILS_AFTER_ONE = """
import errno, os, sys
from runtime import runner, supervisor

forks = []
real_fork = os.fork

def fork():  # the second fork fails, as under a limit on processes
    forks.append(1)
    if len(forks) > 1:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
    return real_fork()

supervisor.os.fork = fork
sys.exit(runner.main("buyer", argv=sys.argv[1:]))
"""


def test_a_worker_that_cannot_be_forked_fails_the_start_and_stops_the_others(tmp_path: Path) -> None:
    # before: the OSError was a traceback (exit 1), the first worker left running, and the
    # supervisor's SIGTERM and SIGINT blocked
    done = subprocess.run([sys.executable, "-c", FORK_FAILS_AFTER_ONE, "--port", "0", "--workers", "2",
                           "--db-url", f"sqlite:///{tmp_path / 'market.db'}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1] == ("error: buyer server: cannot start a worker process: "
                                            "Resource temporarily unavailable")
    assert "signal 15: stopping" in done.stderr  # the worker that had started was stopped


@pytest.mark.slow
def test_a_frozen_worker_is_killed_and_replaced(tmp_path: Path) -> None:
    """Before, the supervisor restarted only workers that died: one stopped by SIGSTOP held
    its share of the connections unanswered for good."""
    server = ServerProcess("buyer", f"sqlite:///{tmp_path / 'market.db'}", 0, "--workers", "2",
                           MARKET_WORKER_TIMEOUT_S="2")
    a_frozen_worker_is_replaced(server, server.connect)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_server_process_sweeps_old_rows_in_the_background(workers: str, tmp_path: Path) -> None:
    from sqlalchemy import func, insert, select

    from db.housekeeping import FORGET_FAILURES_AFTER_MS
    from db.schema import login_failures

    url = f"sqlite:///{tmp_path / 'market.db'}"
    database = Database(url, pool_size=1)
    make_current(database)
    old = int(time.time() * 1000) - FORGET_FAILURES_AFTER_MS - 1000
    database.run(lambda tx: tx.execute(insert(login_failures), [
        {"role": "buyer", "username": f"ghost{n}", "failures": 7, "last_failure_ms": old}
        for n in range(500)]))

    def left() -> int:
        return int(database.run(lambda tx: tx.execute(select(func.count()).select_from(login_failures))
                                .scalar_one(), write=False))

    server = ServerProcess("buyer", url, 0, "--workers", workers, MARKET_HOUSEKEEPING_INTERVAL_S="0.2")
    try:
        server.wait_ready()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and (left() or "housekeeping deleted" not in server.stderr()):
            time.sleep(0.1)  # the sweep commits, then logs: wait for both
        assert left() == 0, server.stderr()
        assert "housekeeping deleted" in server.stderr()
        assert server.stop() == 0
    finally:
        database.close()
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


def _http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def _threads_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^Threads:\s+(\d+)", status, re.MULTILINE).group(1))  # type: ignore[union-attr]


@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["single", "workers"])
def test_healthz_and_readyz_answer_over_http_on_the_metrics_port(workers: list[str], tmp_path: Path) -> None:
    database, metrics_port = tmp_path / "market.db", free_port()
    server = ServerProcess("buyer", f"sqlite:///{database}", 0, "--metrics-port", str(metrics_port),
                           *workers).wait_ready()
    try:
        assert _http_get(metrics_port, "/healthz") == (200, "ok\n")
        assert _http_get(metrics_port, "/readyz") == (200, "ready\n")
        with contextlib.closing(sqlite3.connect(database)) as db, db:
            (revision,) = db.execute("SELECT version_num FROM alembic_version").fetchone()
            db.execute("UPDATE alembic_version SET version_num = 'f00d'")
        status, reason = _http_get(metrics_port, "/readyz")
        assert status == 503 and "not ready: database:" in reason, reason
        assert _http_get(metrics_port, "/healthz")[0] == 200  # alive all the same
        with contextlib.closing(sqlite3.connect(database)) as db, db:
            db.execute("UPDATE alembic_version SET version_num = ?", (revision,))
        assert _http_get(metrics_port, "/readyz")[0] == 200
        assert _http_get(metrics_port, "/nothing")[0] == 404
        assert server.stop() == 0, server.stderr()
    finally:
        server.proc.kill()


def test_the_metrics_port_bounds_its_connections_threads_and_time(tmp_path: Path) -> None:
    # before: a thread per connection, without limit or timeout (3,000 idle connections made
    # 2,938 threads and, closed at once, stalled the market's pings for minutes)
    metrics_port = free_port()
    server = ServerProcess("buyer", f"sqlite:///{tmp_path / 'market.db'}", 0,
                           "--metrics-port", str(metrics_port), MARKET_METRICS_TIMEOUT_S="1").wait_ready()
    idle = []
    try:
        threads = _threads_of(server.proc.pid)
        idle = [socket.create_connection(("127.0.0.1", metrics_port), timeout=30) for _ in range(100)]
        assert _http_get(metrics_port, "/healthz") == (200, "ok\n")  # the oldest idle ones gave way
        assert _threads_of(server.proc.pid) < threads + 10  # not one per connection
        assert idle[-1].recv(1) == b""  # closed at its time limit (1 s here; 5 s by default), never answered
        assert server.connect().call("ping")["server"] == "buyer"
        assert server.stop() == 0, server.stderr()
    finally:
        for sock in idle:
            sock.close()
        server.proc.kill()


SLOW_SEARCHES = """
import sys, time
from buyer_server.ops import build_app as buyer_app
from runtime import runner

class SlowSearches:  # the buyer's App, each search taking 0.5 s first (as a long search would)
    def __init__(self, app):
        self.app = app
        self.specs, self.background = app.specs, app.background

    def handle(self, message, peer=None):
        if message.get("op") == "search_items":
            time.sleep(0.5)
        return self.app.handle(message, peer)

sys.exit(runner.main("buyer", lambda settings, database: SlowSearches(buyer_app(settings, database)),
                     sys.argv[1:]))
"""


def test_health_checks_are_answered_while_pipelines_of_slow_requests_fill_every_worker(
        tmp_path: Path) -> None:
    # before: the health check's ping waited behind whole pipelines (8 x 0.5 s here) and the
    # supervisor killed healthy workers after MARKET_WORKER_TIMEOUT_S (3 s here)
    log = (tmp_path / "stderr.log").open("w+")
    proc = subprocess.Popen([sys.executable, "-c", SLOW_SEARCHES, "--port", "0", "--workers", "2",
                             "--db-url", f"sqlite:///{tmp_path / 'market.db'}"], stdout=subprocess.PIPE,
                            stderr=log, text=True, env={**os.environ, "MARKET_WORKER_TIMEOUT_S": "3"})
    try:
        assert proc.stdout is not None
        match = LISTENING.match(proc.stdout.readline().strip())
        assert match, log.read()
        workers = child_pids(proc.pid)
        search = encode_frame({"op": "search_items", "args": {"query": "lamp"}})
        port = int(match.group(2))
        attack = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(8)]
        for sock in attack:  # 8 pipelines of 8: each 4 s or more, longer than the timeout
            sock.sendall(search * 8)
        for sock in attack:
            assert len(read_messages(sock, 8)) == 8
        assert child_pids(proc.pid) == workers
        log.seek(0)
        assert "did not answer a health check" not in log.read()
        for sock in attack:
            sock.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
