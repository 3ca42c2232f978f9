"""Start the buyer and seller servers as subprocesses (`python -m buyer_server --port 0`),
read the `listening on HOST:PORT` line each prints, and stop them with SIGTERM.

Their logs (stderr) go to a file, so a failed start can be read afterwards.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

Address = tuple[str, int]
START_TIMEOUT_S = 60.0


class ServerStartError(RuntimeError):
    """A server exited or stayed silent instead of printing `listening on`."""


def parse_address(text: str) -> Address:
    """HOST:PORT as a (host, port) pair."""
    host, _, port = text.strip().rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


@dataclass
class ServerProcess:
    """A server started by `start_server`: its process, address and log."""

    role: str
    process: subprocess.Popen[str]
    address: Address
    log_path: Path


@contextmanager
def running_servers(db_url: str, log_dir: Path,
                    extra_args: tuple[str, ...] = ()) -> Iterator[dict[str, Address]]:
    """Both servers on free ports over one database, as {"buyer": addr, "seller": addr}."""
    with running_server_processes(db_url, log_dir, extra_args) as servers:
        yield {role: server.address for role, server in servers.items()}


@contextmanager
def running_server_processes(db_url: str, log_dir: Path,
                             extra_args: tuple[str, ...] = ()) -> Iterator[dict[str, ServerProcess]]:
    """Both servers as processes (to watch or signal), stopped at the end if still running."""
    from db import DatabaseUnusable
    from db.migrations import make_current  # the servers refuse a database not current

    try:
        make_current(db_url)
    except DatabaseUnusable as exc:
        raise ServerStartError(f"the servers cannot start: {exc}") from None
    processes: list[subprocess.Popen[str]] = []
    try:
        servers = {}
        for role in ("buyer", "seller"):
            log_path = log_dir / f"{role}_server.log"
            process = _spawn(role, db_url, log_path, extra_args)
            processes.append(process)
            servers[role] = ServerProcess(role, process, _wait_listening(process, role, log_path), log_path)
        yield servers
    finally:
        for process in processes:
            stop_process(process)


def start_server(role: str, db_url: str, log_path: Path, port: int = 0,
                 env: dict[str, str] | None = None,
                 checkout: Path | None = None) -> tuple[subprocess.Popen[str], Address]:
    """One server process, once it listens, and its address; its log appended to `log_path`.
    `checkout`: another checkout's server, run by its own .venv's python inside it."""
    process = _spawn(role, db_url, log_path, (), port, env, checkout)
    return process, _wait_listening(process, role, log_path)


def _spawn(role: str, db_url: str, log_path: Path, extra_args: tuple[str, ...], port: int = 0,
           env: dict[str, str] | None = None, checkout: Path | None = None) -> subprocess.Popen[str]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    python = str(checkout / ".venv" / "bin" / "python") if checkout else sys.executable
    with log_path.open("a") as log:
        return subprocess.Popen(
            [python, "-m", f"{role}_server", "--port", str(port), "--db-url", db_url,
             "--log-level", "WARNING", *extra_args],
            stdout=subprocess.PIPE, stderr=log, text=True, cwd=checkout,
            # every simulated user signs up from this one address: no limit on sign-ups
            env={**(os.environ if env is None else env), "MARKET_SIGNUPS_PER_ADDRESS_HOUR": "0"})


def _wait_listening(process: subprocess.Popen[str], role: str, log_path: Path) -> Address:
    found: list[Address] = []
    reader = threading.Thread(target=_read_stdout, args=(process.stdout, found), daemon=True)
    reader.start()
    reader.join(START_TIMEOUT_S)
    if not found:
        said = _last_line(log_path)
        code = process.poll() if reader.is_alive() else _exit_code(process)
        raise ServerStartError(f"the {role} server did not print 'listening on' (exit code {code})"
                               + (f", and said: {said}" if said else "") + f"; see {log_path}")
    return found[0]


def _exit_code(process: subprocess.Popen[str]) -> int | None:
    """The status of a server whose output has ended: it is exiting, give it a moment (read
    at once, it was now and then still None)."""
    try:
        return process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


def _last_line(path: Path) -> str:
    """The last line a server wrote to its log (its reason, when it could not start)."""
    lines = path.read_text(errors="replace").strip().splitlines()
    return lines[-1] if lines else ""


def _read_stdout(stream: IO[str] | None, found: list[Address]) -> None:
    """Find the listening line, then keep draining so the pipe never fills."""
    assert stream is not None
    for line in stream:
        if line.startswith("listening on ") and not found:
            found.append(parse_address(line.removeprefix("listening on ")))
            threading.Thread(target=_drain, args=(stream,), daemon=True).start()
            return


def _drain(stream: IO[str]) -> None:
    for _ in stream:
        pass


def stop_on_sigterm(_signum: int, _frame: FrameType | None) -> None:
    """A SIGTERM handler for a tool that starts servers and databases: SIGTERM unwinds through
    every `finally`, so what was started is stopped."""
    raise SystemExit(143)


def stop_process(process: subprocess.Popen[str], timeout_s: float = 15.0) -> float | None:
    """SIGTERM, then SIGKILL after timeout_s; the seconds SIGTERM took (0 if it had already
    ended), or None if it had to be killed."""
    if process.poll() is not None:
        return 0.0
    asked = time.monotonic()
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None
    return time.monotonic() - asked
