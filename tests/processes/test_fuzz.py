"""Fuzzing both servers: a stateful model test, and malformed frames over TCP.

The model test drives both servers with hypothesis against a plain-Python model of
the marketplace (accounts, stock, carts, purchases, votes) and checks every answer
and, after each step, the database audit. The malformed-frame test sends 10,000
frames that break the framing, the JSON or the envelope to server processes and
checks that each one gets an error or a clean close, the servers stay up, and no
table changes.
"""
from __future__ import annotations

import json
import random
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import MetaData, select
from support import CARD, Market, ServerProcess, unique_name

from db import Database
from operate.audit import audit
from wire import Connection, ProtocolError
from wire.framing import HEADER, decode_body, encode_frame

# -- the stateful model test ---------------------------------------------------------


def money(cents: int) -> str:
    return f"{cents // 100}.{cents % 100:02d}"


@dataclass
class ModelItem:
    seller: int  # index into the machine's sellers
    price: int  # cents
    stock: int
    up: int = 0
    down: int = 0


@dataclass
class ModelBuyer:
    conn: Connection
    cart: dict[int, int] = field(default_factory=dict)
    saved: dict[int, int] = field(default_factory=dict)
    bought: set[int] = field(default_factory=set)
    votes: dict[int, str] = field(default_factory=dict)
    history: list[tuple[int, int, int]] = field(default_factory=list)  # (order_id, item_id, qty)
    receipts: dict[str, dict[str, Any]] = field(default_factory=dict)  # idempotency key -> answer


def error_code(call: Callable[[], Any]) -> str:
    """Run a call; "OK" or the error code it raised."""
    try:
        call()
    except ProtocolError as exc:
        return exc.code
    return "OK"


class MarketMachine(RuleBasedStateMachine):
    """Two sellers and two buyers against a model; items are created by the rules."""

    items = Bundle("items")

    def __init__(self, market: Market) -> None:
        super().__init__()
        self.market = market
        self.model: dict[int, ModelItem] = {}
        self.sold: list[int] = [0, 0]  # units sold per seller
        self.sellers: list[Connection] = []
        self.buyers: list[ModelBuyer] = []

    @initialize()
    def accounts(self) -> None:
        self.sellers = [self.market.user("seller") for _ in range(2)]
        self.buyers = [ModelBuyer(self.market.user("buyer")) for _ in range(2)]

    # -- seller rules --

    @rule(target=items, seller=st.integers(0, 1), price=st.integers(1, 100_000),
          stock=st.integers(1, 6))
    def put_item(self, seller: int, price: int, stock: int) -> int:
        item_id = self.market.item(self.sellers[seller], price=money(price), quantity=stock)
        assert item_id not in self.model
        self.model[item_id] = ModelItem(seller, price, stock)
        return item_id

    @rule(item_id=items, seller=st.integers(0, 1), price=st.integers(1, 100_000))
    def change_price(self, item_id: int, seller: int, price: int) -> None:
        item = self.model[item_id]
        call = lambda: self.sellers[seller].call("change_price", {"item_id": item_id, "price": money(price)})  # noqa: E731
        if seller != item.seller:
            assert error_code(call) == "FORBIDDEN"
            return
        assert call()["price"] == money(price)
        item.price = price

    @rule(item_id=items, seller=st.integers(0, 1), quantity=st.integers(1, 4))
    def remove_item(self, item_id: int, seller: int, quantity: int) -> None:
        item = self.model[item_id]
        call = lambda: self.sellers[seller].call("remove_item", {"item_id": item_id, "quantity": quantity})  # noqa: E731
        if seller != item.seller:
            assert error_code(call) == "FORBIDDEN"
        elif quantity > item.stock:
            assert error_code(call) == "CONFLICT"
        else:
            item.stock -= quantity
            assert call()["quantity"] == item.stock

    @rule(seller=st.integers(0, 1))
    def display_items(self, seller: int) -> None:
        listed = self.sellers[seller].call("display_items", {"limit": 500})["items"]
        expected = sorted(i for i, item in self.model.items() if item.seller == seller and item.stock > 0)
        assert [it["item_id"] for it in listed] == expected
        for it in listed:
            assert (it["quantity"], it["price"]) == (self.model[it["item_id"]].stock,
                                                      money(self.model[it["item_id"]].price))

    # -- buyer rules --

    @rule(item_id=items, buyer=st.integers(0, 1), quantity=st.integers(1, 4))
    def add_to_cart(self, item_id: int, buyer: int, quantity: int) -> None:
        b = self.buyers[buyer]
        call = lambda: b.conn.call("add_to_cart", {"item_id": item_id, "quantity": quantity})  # noqa: E731
        if b.cart.get(item_id, 0) + quantity > self.model[item_id].stock:
            assert error_code(call) == "CONFLICT"
        else:
            b.cart[item_id] = b.cart.get(item_id, 0) + quantity
            self.check_cart(b, call()["cart"])

    @rule(item_id=items, buyer=st.integers(0, 1), quantity=st.integers(1, 4))
    def remove_from_cart(self, item_id: int, buyer: int, quantity: int) -> None:
        b = self.buyers[buyer]
        held = b.cart.pop(item_id, 0)
        if held > quantity:
            b.cart[item_id] = held - quantity
        cart = b.conn.call("remove_from_cart", {"item_id": item_id, "quantity": quantity})["cart"]
        self.check_cart(b, cart)

    @rule(buyer=st.integers(0, 1), op=st.sampled_from(["display_cart", "clear_cart", "save_cart"]))
    def cart_op(self, buyer: int, op: str) -> None:
        b = self.buyers[buyer]
        if op == "clear_cart":
            b.cart.clear()
        elif op == "save_cart":
            b.saved = dict(b.cart)
        self.check_cart(b, b.conn.call(op)["cart"])

    @rule(buyer=st.integers(0, 1))
    def login_again(self, buyer: int) -> None:
        b = self.buyers[buyer]
        b.conn.call("logout")
        assert error_code(lambda: b.conn.call("display_cart")) == "UNAUTHENTICATED"
        b.conn.token = b.conn.call("login", {"username": b.conn.username,  # type: ignore[attr-defined]
                                             "password": "correct horse"})["token"]
        b.cart = dict(b.saved)
        self.check_cart(b, b.conn.call("display_cart")["cart"])

    @rule(buyer=st.integers(0, 1), key=st.none() | st.sampled_from(["k1", "k2", "k3"]))
    def make_purchase(self, buyer: int, key: str | None) -> None:
        b = self.buyers[buyer]
        args = {**CARD, **({"idempotency_key": key} if key else {})}
        call = lambda: b.conn.call("make_purchase", args)  # noqa: E731
        if key in b.receipts:
            assert call() == b.receipts[key]
            return
        if not b.cart or any(q > self.model[i].stock for i, q in b.cart.items()):
            assert error_code(call) == "CONFLICT"
            return
        receipt = call()
        lines = sorted(b.cart.items())
        assert [(ln["item_id"], ln["quantity"], ln["price"]) for ln in receipt["lines"]] == [
            (i, q, money(self.model[i].price)) for i, q in lines]
        assert receipt["total"] == money(sum(q * self.model[i].price for i, q in lines))
        for item_id, quantity in lines:
            self.model[item_id].stock -= quantity
            self.sold[self.model[item_id].seller] += quantity
            b.bought.add(item_id)
            b.history.append((receipt["order_id"], item_id, quantity))
        b.cart.clear()
        b.saved.clear()
        if key:
            b.receipts[key] = receipt

    @rule(item_id=items, buyer=st.integers(0, 1), vote=st.sampled_from(["up", "down"]))
    def provide_feedback(self, item_id: int, buyer: int, vote: str) -> None:
        b, item = self.buyers[buyer], self.model[item_id]
        code = error_code(lambda: b.conn.call("provide_feedback", {"item_id": item_id, "vote": vote}))
        if item_id not in b.bought:
            assert code == "FORBIDDEN"
        elif item_id in b.votes:
            assert code == "CONFLICT"
        else:
            assert code == "OK"
            b.votes[item_id] = vote
            item.up += vote == "up"
            item.down += vote == "down"

    @rule(item_id=items)
    def get_item(self, item_id: int) -> None:
        item = self.model[item_id]
        got = self.buyers[0].conn.call("get_item", {"item_id": item_id})
        assert (got["quantity"], got["price"], got["thumbs_up"], got["thumbs_down"]) == (
            item.stock, money(item.price), item.up, item.down)
        assert got["seller_id"] == self.sellers[item.seller].user_id  # type: ignore[attr-defined]

    @rule(buyer=st.integers(0, 1))
    def get_item_that_does_not_exist(self, buyer: int) -> None:
        missing = max(self.model, default=0) + 10_000
        assert error_code(lambda: self.buyers[buyer].conn.call(
            "add_to_cart", {"item_id": missing, "quantity": 1})) == "NOT_FOUND"

    @rule(seller=st.integers(0, 1))
    def get_seller_rating(self, seller: int) -> None:
        seller_id = self.sellers[seller].user_id  # type: ignore[attr-defined]
        expected = {"seller_id": seller_id, "items_sold": self.sold[seller],
                    "thumbs_up": sum(i.up for i in self.model.values() if i.seller == seller),
                    "thumbs_down": sum(i.down for i in self.model.values() if i.seller == seller)}
        assert self.buyers[0].conn.call("get_seller_rating", {"seller_id": seller_id}) == expected
        assert self.sellers[seller].call("get_seller_rating") == expected

    @rule(buyer=st.integers(0, 1))
    def get_purchase_history(self, buyer: int) -> None:
        b = self.buyers[buyer]
        got = b.conn.call("get_purchase_history", {"limit": 500})["purchases"]
        assert [(p["order_id"], p["item_id"], p["quantity"], p["feedback"]) for p in got] == [
            (*h, b.votes.get(h[1])) for h in sorted(b.history, key=lambda h: (-h[0], h[1]))]

    # -- invariants --

    @invariant()
    def stock_is_never_negative_nor_oversold(self) -> None:
        assert all(item.stock >= 0 for item in self.model.values())

    def teardown(self) -> None:
        """The database's books balance and every item is as the model says."""
        if self.buyers:
            for item_id in self.model:
                self.get_item(item_id)
            assert audit(self.market.db) == []

    def check_cart(self, b: ModelBuyer, cart: dict[str, Any]) -> None:
        expected = [(i, q, self.model[i].stock, money(self.model[i].price))
                    for i, q in sorted(b.cart.items())]
        got = [(ln["item_id"], ln["quantity"], ln["available"], ln["price"]) for ln in cart["items"]]
        assert got == expected
        assert cart["total"] == money(sum(q * self.model[i].price for i, q in b.cart.items()))


def test_both_servers_agree_with_a_model_of_the_marketplace(market: Market) -> None:
    run_state_machine_as_test(
        lambda: MarketMachine(market),
        settings=settings(max_examples=10, stateful_step_count=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]))


# -- malformed frames ------------------------------------------------------------------

FRAME_COUNT = 10_000
CLOSE_BOUND_S = 2.0  # asserted per frame; the observed maximum is recorded in docs/reliability.md
MAX_FRAME = 1 << 20
HOSTILE_TEXT = ["' OR '1'='1", "'; DROP TABLE users; --", "\" OR \"\"=\"", "1; DELETE FROM items",
                "admin'--", "\x00", "a\x00b", "\u202egnp.exe", "\u202bשלום\u202c", "%s%s%n",
                "${jndi:ldap://x}", "\ufeff", "🙂" * 40, "a" * 100_000, ""]
HUGE_NUMBERS = ["1e400", "-1e400", "9" * 30, "-" + "9" * 30, "1" + "0" * 4400, "1.0", "0",
                "-1", "18446744073709551616", "9223372036854775808", "1e-400"]


@dataclass
class Probe:
    """One malformed frame and how the server must react."""

    kind: str
    data: bytes
    closes: bool | None  # closes after at most one error answer; False: answers, stays; None: depends


def _frame(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


def _json_frame(text: str) -> bytes:
    return _frame(text.encode("utf-8", "surrogatepass"))


def _raw_bytes(rng: random.Random) -> Probe:
    data = rng.randbytes(rng.randint(1, 64))
    return Probe("random bytes", data, None)


def _bad_length(rng: random.Random) -> Probe:
    length = rng.choice([0, MAX_FRAME + 1, MAX_FRAME + rng.randint(2, 1 << 30), 0xFFFFFFFF])
    return Probe("bad length", HEADER.pack(length) + b'{"op":"ping"}', True)


def _truncated(rng: random.Random) -> Probe:
    whole = encode_frame({"op": "ping", "id": rng.randint(1, 1000)})
    return Probe("truncated", whole[: rng.randint(1, len(whole) - 1)], True)


def _not_utf8(rng: random.Random) -> Probe:
    bad = rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"])
    return Probe("invalid UTF-8", _frame(b'{"op":"' + bad + b'"}'), True)


def _not_object(rng: random.Random) -> Probe:
    text = rng.choice(['[]', '[{"op":"ping"}]', '"ping"', '42', 'null', 'true', '{"op":"ping"',
                       '{op:"ping"}', "{'op':'ping'}", '{"op":"ping"}{"op":"ping"}', ' ', '{"op":"ping",}'])
    return Probe("not a JSON object", _json_frame(text), True)


def _constants(rng: random.Random) -> Probe:
    value = rng.choice(["NaN", "Infinity", "-Infinity"])
    return Probe("NaN/Infinity", _json_frame(f'{{"op":"get_item","args":{{"item_id":{value}}}}}'), True)


def _duplicate_keys(rng: random.Random) -> Probe:
    text = rng.choice(['{"op":"ping","op":"ping"}', '{"op":"get_item","args":{"item_id":1,"item_id":2}}',
                       '{"id":1,"id":1,"op":"ping"}'])
    return Probe("duplicate keys", _json_frame(text), True)


def _lone_surrogate(rng: random.Random) -> Probe:
    escape = rng.choice(["\\ud800", "\\udfff", "\\uDBFF", "a\\ud83d"])
    return Probe("lone surrogate", _json_frame(f'{{"op":"ping","id":"{escape}"}}'), True)


def _deep_nesting(rng: random.Random) -> Probe:
    depth = rng.choice([1_100, 5_000, 30_000])  # past json's recursion limit of 1,000
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
    text = f'{{"op":"ping","args":{opener * depth}1{closer * depth}}}'
    return Probe("deep nesting", _json_frame(text), True)


def _wrong_types(rng: random.Random) -> Probe:
    value = rng.choice([True, 1.0, "1", [1], {"a": 1}, None, -1, 0, 10**19])
    message = rng.choice([
        {"op": rng.choice([1, None, [], "", "ping " * 3, "PING", "drop"])},
        {"op": "get_item", "args": {"item_id": value}},
        {"op": "get_item", "args": [value]},
        {"op": "add_to_cart", "token": value, "args": {"item_id": 1, "quantity": value}},
        {"op": "search_items", "args": {"category": value, "keywords": value}},
        {"op": "ping", "id": {"nested": value}},
        {"op": "ping", "arg": {}},
        {"op": "create_account", "args": {"username": value, "password": value, "name": value}},
    ])
    return Probe("wrong types", encode_frame(message), False)


def _huge_number(rng: random.Random) -> Probe:
    number = rng.choice(HUGE_NUMBERS)
    op = rng.choice(["get_item", "get_seller_rating"])
    key = "item_id" if op == "get_item" else "seller_id"
    text = rng.choice([f'{{"op":"{op}","args":{{"{key}":{number}}}}}', f'{{"op":"ping","id":{number}}}'])
    return Probe("huge number", _json_frame(text), None)  # over 4,300 digits is not JSON we take


def _hostile_text(rng: random.Random) -> Probe:
    text = rng.choice(HOSTILE_TEXT)
    message = rng.choice([
        {"op": "search_items", "args": {"keywords": [text[:8] or "x"], "category": 1}},
        {"op": "search_items", "token": text, "args": {"keywords": [text]}},
        {"op": "create_account", "args": {"username": text[:40], "password": "p", "name": text}},
        {"op": "login", "args": {"username": text, "password": ""}},
        {"op": text, "args": {"item_id": 1}},
        {"op": "get_item", "args": {"item_id": text}},
        {"op": "put_item", "token": text, "args": {"name": text}},
        {"op": "ping", "id": text},
    ])
    return Probe("SQL injection / NUL / RTL text", encode_frame(message), False)


GENERATORS = [_raw_bytes, _bad_length, _truncated, _not_utf8, _not_object, _constants, _duplicate_keys,
              _lone_surrogate, _deep_nesting, _wrong_types, _huge_number, _hostile_text]


def probes(count: int, seed: int = 1) -> Iterator[Probe]:
    """`count` malformed frames, every kind in turn, reproducible from the seed."""
    rng = random.Random(seed)
    for n in range(count):
        yield GENERATORS[n % len(GENERATORS)](rng)


def strictly_rejected(probe: Probe) -> bool:
    """Whether a strict decoder rejects the frame (or it never completes)."""
    if len(probe.data) < HEADER.size:
        return True
    (length,) = struct.unpack(">I", probe.data[:4])
    if length == 0 or length > MAX_FRAME or len(probe.data) - 4 < length:
        return True
    try:
        decode_body(probe.data[4:4 + length])
    except ProtocolError:
        return True
    return len(probe.data) - 4 > length  # trailing bytes start another (bad) frame


class FrameSender:
    """Sends probes to one server: closing ones on their own socket, the rest pipelined."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address
        self.slowest = 0.0
        self.codes: dict[str, int] = {}
        self._open: socket.socket | None = None

    def send_closing(self, probe: Probe) -> None:
        """Send, half-close, and expect at most one error frame and then the end of the stream."""
        with socket.create_connection(self.address, timeout=CLOSE_BOUND_S) as sock:
            started = time.monotonic()
            try:
                sock.sendall(probe.data)
                sock.shutdown(socket.SHUT_WR)  # a truncated frame ends here: the server sees EOF
            except OSError:  # the server closed before taking it all (FRAME_TOO_LARGE)
                pass
            received = _read_to_end(sock)
            self.slowest = max(self.slowest, time.monotonic() - started)
        responses = _split_frames(received)
        assert len(responses) <= 1, (probe, responses)
        for response in responses:
            assert response["ok"] is False and response["id"] is None, (probe, response)
            self._count(response)
            assert response["error"]["code"] in ("BAD_FRAME", "FRAME_TOO_LARGE"), (probe, response)

    def send_staying(self, batch: list[Probe]) -> None:
        """Pipeline frames that keep the connection open; one answer each (an error but for ping)."""
        if self._open is None:
            self._open = socket.create_connection(self.address, timeout=CLOSE_BOUND_S)
        started = time.monotonic()
        self._open.sendall(b"".join(p.data for p in batch))
        buffer = b""
        responses: list[dict[str, Any]] = []
        while len(responses) < len(batch):
            chunk = self._open.recv(1 << 20)
            assert chunk, f"the server closed a connection it should keep: {batch[len(responses)]}"
            buffer += chunk
            while len(buffer) >= 4 and len(buffer) - 4 >= struct.unpack(">I", buffer[:4])[0]:
                (length,) = struct.unpack(">I", buffer[:4])
                responses.append(json.loads(buffer[4:4 + length]))
                buffer = buffer[4 + length:]
        self.slowest = max(self.slowest, time.monotonic() - started)  # bounds each answer in the batch
        for probe, response in zip(batch, responses, strict=True):
            if response["ok"]:  # a ping whose id is hostile text: it must come back exactly
                message = decode_body(probe.data[4:])
                assert message["op"] == "ping" and response["id"] == message["id"], (probe, response)
                continue
            self._count(response)
            assert response["error"]["code"] in ("BAD_REQUEST", "UNKNOWN_OP", "UNAUTHENTICATED",
                                                 "NOT_FOUND"), (probe, response)

    def close(self) -> None:
        if self._open is not None:
            self._open.close()

    def _count(self, response: dict[str, Any]) -> None:
        code = response["error"]["code"]
        self.codes[code] = self.codes.get(code, 0) + 1


def _read_to_end(sock: socket.socket) -> bytes:
    data = b""
    while chunk := _recv(sock):
        data += chunk
    return data


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""  # a close with unread input becomes a reset: still a clean close


def _split_frames(data: bytes) -> list[dict[str, Any]]:
    out = []
    while len(data) >= 4:
        (length,) = struct.unpack(">I", data[:4])
        out.append(json.loads(data[4:4 + length]))
        data = data[4 + length:]
    assert data == b"", "a partial response frame"
    return out


def table_snapshot(database: Database) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, sorted: equal snapshots mean nothing changed."""
    tables = MetaData()
    tables.reflect(bind=database.engine)

    def read(tx: Any) -> dict[str, list[tuple[Any, ...]]]:
        return {name: sorted(tuple(map(repr, row)) for row in tx.execute(select(table)))
                for name, table in tables.tables.items()}

    return database.run(read, write=False)


@pytest.fixture
def server_processes(database: Database,
                     monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, ServerProcess]]:
    """A buyer and a seller server process over the test's database, letting this one client
    open a connection per malformed frame as fast as it can (the rate is tested elsewhere)."""
    monkeypatch.setenv("MARKET_NEW_CONNECTIONS_PER_S_PER_ADDRESS", "1000000")
    servers = {role: ServerProcess(role, database.url) for role in ("buyer", "seller")}
    try:
        yield {role: server.wait_ready() for role, server in servers.items()}
    finally:
        for server in servers.values():
            server.proc.kill()
            server.proc.wait()


@pytest.mark.parametrize("db_url", ["mariadb"], indirect=True)  # SQL text meets a real SQL server
def test_ten_thousand_malformed_frames_leave_the_servers_up_and_the_tables_unchanged(
        database: Database, server_processes: dict[str, ServerProcess]) -> None:
    seller = server_processes["seller"].connect()
    name = unique_name("seller")
    seller.call("create_account", {"username": name, "password": "correct horse", "name": name})
    seller.token = seller.call("login", {"username": name, "password": "correct horse"})["token"]
    seller.call("put_item", {"name": "Lamp", "category": 1, "keywords": ["x"], "condition": "new",
                             "price": "1.00", "quantity": 3})
    before = table_snapshot(database)
    senders = [FrameSender((s.host, s.port)) for s in server_processes.values()]
    staying: list[list[Probe]] = [[], []]
    for n, probe in enumerate(probes(FRAME_COUNT)):
        target = n % 2
        closes = strictly_rejected(probe)
        assert probe.closes in (None, closes), probe  # the decoder is as strict as PROTOCOL.md
        if closes:
            senders[target].send_closing(probe)
        else:
            staying[target].append(probe)
            if len(staying[target]) == 50:
                senders[target].send_staying(staying[target])
                staying[target] = []
    for sender, batch in zip(senders, staying, strict=True):
        if batch:
            sender.send_staying(batch)
        sender.close()
    for server in server_processes.values():
        assert server.proc.poll() is None, server.stderr()
        assert server.connect().call("ping")["server"] in ("buyer", "seller")
    assert table_snapshot(database) == before
    slowest = max(s.slowest for s in senders)
    print(f"malformed frames: slowest answer or close {slowest * 1000:.1f} ms;",
          {k: sum(s.codes.get(k, 0) for s in senders) for k in set().union(*(s.codes for s in senders))})
    assert slowest < CLOSE_BOUND_S
