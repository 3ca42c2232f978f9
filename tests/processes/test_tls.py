"""TLS: optional on the servers; a plaintext client is closed without being served."""
from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import CARD, PASSWORD, Market, ServerProcess, a_frozen_worker_is_replaced, port_of, unique_name

from buyer_server.ops import build_app
from db import Database
from db.migrations import make_current
from runtime.config import Settings
from runtime.server import Server
from wire import Connection
from wire.framing import encode_frame
from wire.tls import client_context, server_context


@pytest.fixture(scope="session")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 and localhost, made with openssl."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return str(cert), str(key)


@pytest.fixture
def tls_server(tmp_path: Path, certificate: tuple[str, str]) -> Iterator[Server]:
    db = Database(f"sqlite:///{tmp_path / 'tls.db'}", pool_size=4)
    make_current(db)
    server = Server(build_app(Settings(role="buyer"), db), tls=server_context(*certificate))
    server.start()
    yield server
    server.shutdown()
    db.close()


def test_a_tls_client_does_everything_over_tls(tls_server: Server, certificate: tuple[str, str]) -> None:
    opened: list[ssl.SSLSocket] = []

    class Recorded(ssl.SSLSocket):  # each socket the client's context opens, to ask its version
        def do_handshake(self, block: bool = False) -> None:
            super().do_handshake(block)
            opened.append(self)

    context = client_context(certificate[0])
    context.sslsocket_class = Recorded
    conn = Connection(*tls_server.address, tls=context)
    name = unique_name()
    conn.call("create_account", {"username": name, "password": PASSWORD, "name": name})
    conn.token = conn.call("login", {"username": name, "password": PASSWORD})["token"]
    assert conn.call("display_cart")["cart"]["total"] == "0.00"
    assert len(opened) == 1 and opened[0].version() in ("TLSv1.2", "TLSv1.3")
    for n in range(20):  # pipelined over TLS
        conn.send({"id": n, "op": "ping"})
    assert [conn.receive()["id"] for _ in range(20)] == list(range(20))
    with pytest.raises(Exception, match="empty"):
        conn.call("make_purchase", CARD)


def test_a_plaintext_client_is_closed_without_being_served(tls_server: Server) -> None:
    sock = socket.create_connection(tls_server.address, timeout=5)
    sock.sendall(encode_frame({"id": 1, "op": "ping"}))
    received = b""
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    assert b'"ok"' not in received and b"pong" not in received and b"buyer" not in received


def test_a_client_that_does_not_trust_the_certificate_refuses_it(tls_server: Server) -> None:
    conn = Connection(*tls_server.address, tls=client_context(None))
    with pytest.raises(ssl.SSLCertVerificationError):
        conn.call("ping")
    ok = Connection(*tls_server.address, tls=_trust_anything())
    assert ok.call("ping")["server"] == "buyer"


def _trust_anything() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def test_the_server_process_takes_tls_flags(tmp_path: Path, certificate: tuple[str, str]) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "seller_server", "--port", "0",
                             "--db-url", f"sqlite:///{tmp_path / 's.db'}",
                             "--tls-cert", certificate[0], "--tls-key", certificate[1]],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on 127.0.0.1:")
        port = int(line.rsplit(":", 1)[1])
        conn = Connection("127.0.0.1", port, tls=client_context(certificate[0]))
        assert conn.call("ping")["server"] == "seller"
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0


def test_the_shell_and_health_check_speak_tls(tls_server: Server, certificate: tuple[str, str]) -> None:
    host, port = tls_server.address
    market = [sys.executable, "-m", "client.main"]
    health = subprocess.run([*market, "health", f"{host}:{port}", "--tls-ca", certificate[0]],
                            capture_output=True, text=True, timeout=30)
    assert health.returncode == 0 and "buyer server" in health.stdout
    plain = subprocess.run([*market, "health", f"{host}:{port}"], capture_output=True, text=True, timeout=30)
    assert plain.returncode != 0
    shell = subprocess.run([*market, "buyer", "--port", str(port), "--tls-ca", certificate[0], "-c", "ping"],
                           capture_output=True, text=True, timeout=30)
    assert shell.returncode == 0, shell.stderr


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_simulator_runs_over_tls(market: Market, tmp_path: Path, certificate: tuple[str, str],
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from simulation.__main__ import main as market_sim

    common = ["-n", "2", "-k", "20", "-r", "1", "--no-progress", "--tls-ca", certificate[0]]
    assert market_sim([*common, "--out", str(tmp_path / "tls"),
                       "--tls-cert", certificate[0], "--tls-key", certificate[1]]) == 0
    # the same client against plaintext servers (the market's) cannot even start: it really speaks TLS
    assert market_sim([*common, "--out", str(tmp_path / "plain"), "--allow-live", "--db-url", market.db.url,
                       "--buyer", f"127.0.0.1:{port_of(market, 'buyer')}",
                       "--seller", f"127.0.0.1:{port_of(market, 'seller')}"]) != 0
    assert "[SSL: WRONG_VERSION_NUMBER]" in "".join(capsys.readouterr())


def test_the_simulator_trusts_the_systems_cas_with_tls(tmp_path: Path, certificate: tuple[str, str]) -> None:
    # --tls (as the shells and `market health` take it): OpenSSL's default trust store,
    # which SSL_CERT_FILE points at the test's own CA here
    command = [sys.executable, "-m", "simulation", "-n", "1", "-k", "10", "-r", "1", "--no-progress",
               "--tls", "--tls-cert", certificate[0], "--tls-key", certificate[1], "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "SSL_CERT_FILE": certificate[0]})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "consistency: OK" in done.stdout


def test_tls_clients_that_read_late_or_never_hold_no_thread(certificate: tuple[str, str]) -> None:
    from support import BIG, tiny_app, wait_for_connections, waiting_to_write

    from runtime.server import ServerLimits
    from wire.framing import FrameDecoder

    server = Server(tiny_app(), tls=server_context(*certificate),
                    limits=ServerLimits(threads=1, send_timeout_s=1.5))
    server.start()
    try:
        context = client_context(certificate[0])
        socks = [context.wrap_socket(socket.create_connection(server.address, timeout=10),
                                     server_hostname="127.0.0.1") for _ in range(2)]
        for sock in socks:
            sock.sendall(b"".join(encode_frame({"id": n, "op": "big"}) for n in range(60)))
        never, late = socks
        time.sleep(0.5)
        assert waiting_to_write(server) == 2
        other = Connection(*server.address, timeout=1.0, tls=client_context(certificate[0]))
        assert other.call("ping") == {"pong": True}  # the one thread is free for it
        decoder, answers = FrameDecoder(), []
        while len(answers) < 60:
            decoder.feed(late.recv(65536))
            answers.extend(decoder.messages())
        assert [a["id"] for a in answers] == list(range(60))
        assert all(a["result"]["text"] == BIG for a in answers)
        wait_for_connections(server, 2)
        assert server.connection_count == 2  # `never` read nothing for 1.5 s: closed
        other.close()
        for sock in socks:
            sock.close()
    finally:
        server.shutdown()


def test_a_failed_handshake_is_counted_and_logged_as_a_security_event(
        tmp_path: Path, certificate: tuple[str, str], caplog: pytest.LogCaptureFixture) -> None:
    from prometheus_client import REGISTRY

    from observe.observers import MarketObserver

    db = Database(f"sqlite:///{tmp_path / 'tls.db'}", pool_size=2)
    make_current(db)
    app = build_app(Settings(role="buyer"), db)
    server = Server(app, tls=server_context(*certificate), observer=MarketObserver("tls-test", app.specs))
    server.start()
    try:
        with caplog.at_level("WARNING", logger="market.security"), \
                socket.create_connection(server.address, timeout=5) as plain:
            plain.sendall(encode_frame({"id": 1, "op": "ping"}))
            assert plain.recv(4096) == b""  # closed without an answer
            deadline = time.monotonic() + 5
            while not caplog.records and time.monotonic() < deadline:
                time.sleep(0.02)
    finally:
        server.shutdown()
        db.close()
    refused = [record for record in caplog.records if record.getMessage() == "connection refused"]
    assert refused and refused[0].reason == "tls_handshake"  # type: ignore[attr-defined]
    assert refused[0].client == "127.0.0.1"  # type: ignore[attr-defined]
    assert REGISTRY.get_sample_value("market_connections_refused_total",
                                     {"server": "tls-test", "reason": "tls_handshake"}) == 1


@pytest.mark.slow
def test_a_frozen_tls_worker_is_killed_and_replaced(tmp_path: Path, certificate: tuple[str, str]) -> None:
    """The supervisor's health checks speak TLS to a TLS server's workers."""
    server = ServerProcess("buyer", f"sqlite:///{tmp_path / 'market.db'}", 0, "--workers", "2",
                           "--tls-cert", certificate[0], "--tls-key", certificate[1],
                           MARKET_WORKER_TIMEOUT_S="2")
    a_frozen_worker_is_replaced(server, lambda: Connection(server.host, server.port, timeout=10,
                                                           tls=client_context(certificate[0])))
