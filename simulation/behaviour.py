"""What a simulated buyer or seller does next: each op a mix draws becomes a call with
sensible arguments, chosen from what this user has seen so far.

An op that makes no sense right now is replaced by the step a real shopper takes
first: a purchase with an empty cart becomes an add_to_cart, feedback with nothing
left to rate becomes a look at the purchase history, an add_to_cart before any search
becomes a search. Some answers queue a follow-up: a logout is followed by a login, a
purchase refused for stock by a look at the cart and the removal of what ran out.

A CONFLICT from add_to_cart, make_purchase or remove_item is a race for the last units
and correct behaviour: it is counted as a "conflict", not as an error.
"""
from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from operate.audit import AckedOrder
from operate.purge import LOAD_TEST_PREFIX  # `market admin purge-test-data` removes what is named so
from wire import Connection, ConnectionLostError
from wire.errors import ConflictError, ProtocolError, UnauthenticatedError

KEYWORDS = ("lamp", "desk", "chair", "book", "phone", "shirt", "shoe", "bike",
            "guitar", "watch", "camera", "table", "bag", "coat", "mug", "toy")
PASSWORD = "simulated-password"
LIVE_DATA_WARNING = (f"this writes into a marketplace it did not start: it creates accounts and items "
                     f"named {LOAD_TEST_PREFIX}... and buys its stock")
CARD = {"card_name": "Sim Buyer", "card_number": "4111111111111111", "card_expiry": "12/39"}
EXPECTED_CONFLICTS = frozenset({"add_to_cart", "make_purchase", "remove_item"})
KNOWN_ITEMS = 300  # how many items a buyer remembers from searches


@dataclass
class Call:
    """One request to make."""

    op: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """How one call went: "ok", "conflict", or the error code: CONNECTION for a lost socket,
    RESENT for a call answered only when the connection tried it again after its connection
    failed, in flight or at connect, or on a new connection because the server had closed the
    one the last call left open (it has its answer, a conflict's too, but a server dropped or
    refused a connection: counted as an error)."""

    kind: str
    latency_s: float
    result: dict[str, Any] | None = None
    error: Exception | None = None


_SETUP_BUSY_PAUSES_S = [min(0.05 * 2 ** n, 2.0) for n in range(40)]  # about a minute in all


class Actor:
    """A simulated user of one role: plans calls and learns from their answers."""

    role = ""

    def __init__(self, username: str, rng: random.Random) -> None:
        self.username, self.rng = username, rng
        self.user_id = 0
        self.pending: deque[Call] = deque()
        self._signups = 0
        self.setup_waits = 0  # set-up calls answered BUSY and made again after a pause

    def setup_calls(self) -> list[Call]:
        """The calls made before the barrier: an account, a login, and any seeding."""
        return [Call("create_account", {"username": self.username, "password": PASSWORD,
                                        "name": self.username}),
                self.login_call()]

    def perform_setup(self, conn: Connection, call: Call) -> Outcome:
        """perform(), tried again after a pause while answered BUSY: a hundred users signing
        up at once fill the server's hashing queue, and the run needs them all."""
        outcome = self.perform(conn, call)
        for pause in _SETUP_BUSY_PAUSES_S:
            if outcome.kind != "BUSY":
                break
            time.sleep(random.uniform(pause / 2, pause))  # not self.rng's draws: a seed replays its calls
            self.setup_waits += 1
            outcome = self.perform(conn, call)
        return outcome

    def login_call(self) -> Call:
        """This user's login."""
        return Call("login", {"username": self.username, "password": PASSWORD})

    def next_call(self, op: str) -> Call:
        """The call to make when the mix draws `op` (a queued follow-up comes first)."""
        if self.pending:
            return self.pending.popleft()
        return self.plan(op)

    def plan(self, op: str) -> Call:
        """The call for `op`, or the step that has to come before it."""
        planner = getattr(self, f"_plan_{op}", None)
        return planner() if planner else Call(op)

    def perform(self, conn: Connection, call: Call) -> Outcome:
        """Make the call, time it, and learn from the answer."""
        # a new connection counts when the last call left one open: the server hung up since
        start, connections = time.perf_counter(), (conn.resends, conn.reconnects if conn.is_open else None)
        try:
            result = conn.call(call.op, call.args)
        except ProtocolError as exc:
            latency = time.perf_counter() - start
            if isinstance(exc, UnauthenticatedError) and call.op != "login":
                self._log_in_again(conn)  # counted as an error, but not one per call after it
            self.refused(call, exc)
            if _redialled(conn, connections):
                return Outcome("RESENT", latency, error=_dropped(call))
            expected = isinstance(exc, ConflictError) and call.op in EXPECTED_CONFLICTS
            return Outcome("conflict" if expected else exc.code, latency, error=exc)
        except OSError as exc:
            if call.op in ("login", "logout"):
                # The answer was lost, and with it whether the session lives: as a shopper
                # would, log in again, or every call after it may fail.
                self._log_in_again(conn)
            return Outcome("CONNECTION", time.perf_counter() - start, error=exc)
        latency = time.perf_counter() - start
        if call.op == "login":
            conn.token, self.user_id = result["token"], result["user_id"]
        elif call.op == "logout":
            conn.token = None
        seen = getattr(self, f"_saw_{call.op}", None)
        if seen:
            seen(call, result)
        if _redialled(conn, connections):
            return Outcome("RESENT", latency, result=result, error=_dropped(call))
        return Outcome("ok", latency, result=result)

    def refused(self, call: Call, error: ProtocolError) -> None:
        """Learn from an error answer (override per role)."""

    def _log_in_again(self, conn: Connection) -> None:
        """Drop the token and make a login the next call."""
        conn.token = None
        login = self.login_call()
        if not self.pending or self.pending[0] != login:
            self.pending.appendleft(login)

    def _plan_create_account(self) -> Call:
        self._signups += 1
        name = f"{self.username}.{self._signups}"
        return Call("create_account", {"username": name, "password": PASSWORD, "name": name})

    def _saw_logout(self, call: Call, result: dict[str, Any]) -> None:
        self.pending.append(self.login_call())


class Seller(Actor):
    """Lists stock at seed time, then lists more, reprices, removes and checks ratings."""

    role = "seller"

    def __init__(self, username: str, rng: random.Random, seed_items: int = 3) -> None:
        super().__init__(username, rng)
        self.seed_items = seed_items
        self.items: dict[int, int] = {}  # own item_id -> quantity on sale, as last seen
        self._listed = 0

    def setup_calls(self) -> list[Call]:
        """Account, login, and a few items with plenty of stock."""
        return super().setup_calls() + [self._plan_put_item(100, 300) for _ in range(self.seed_items)]

    def _plan_put_item(self, low: int = 10, high: int = 100) -> Call:
        self._listed += 1
        return Call("put_item", new_item(self.rng, self._listed, low, high))

    def _plan_change_price(self) -> Call:
        if not self.items:
            return self._plan_put_item()
        return Call("change_price", {"item_id": self.rng.choice(list(self.items)), "price": _price(self.rng)})

    def _plan_remove_item(self) -> Call:
        stocked = [item_id for item_id, quantity in self.items.items() if quantity >= 2]
        if not stocked:
            return self._plan_put_item()
        return Call("remove_item", {"item_id": self.rng.choice(stocked), "quantity": 1})

    def _plan_display_items(self) -> Call:
        return Call("display_items", {"limit": 50})

    def _saw_put_item(self, call: Call, result: dict[str, Any]) -> None:
        self.items[result["item_id"]] = call.args["quantity"]

    def _saw_item(self, call: Call, result: dict[str, Any]) -> None:
        self.items[result["item_id"]] = result["quantity"]

    _saw_change_price = _saw_remove_item = _saw_item

    def _saw_display_items(self, call: Call, result: dict[str, Any]) -> None:
        self.items.update({item["item_id"]: item["quantity"] for item in result["items"]})

    def refused(self, call: Call, error: ProtocolError) -> None:
        """A removal beaten by buyers: forget the stale quantity."""
        if call.op == "remove_item":
            self.items[call.args["item_id"]] = 0


class Buyer(Actor):
    """Searches, looks at items, fills a cart, buys with a test card and rates what it bought."""

    role = "buyer"

    def __init__(self, username: str, rng: random.Random) -> None:
        super().__init__(username, rng)
        self.known: dict[int, dict[str, Any]] = {}  # item_id -> item, from searches
        self.cart: dict[int, int] = {}
        self.saved: dict[int, int] = {}
        self.unrated: list[int] = []
        self.rated: set[int] = set()
        self.orders: list[AckedOrder] = []
        self._purchases = 0

    def _plan_search_items(self) -> Call:
        args: dict[str, Any] = {"limit": 20}
        draw = self.rng.random()
        if draw < 0.5 or draw >= 0.9:
            args["category"] = self.rng.randrange(10)
        if draw >= 0.5:
            args["keywords"] = self.rng.sample(KEYWORDS, self.rng.randint(1, 2))
        return Call("search_items", args)

    def _plan_get_item(self) -> Call:
        if not self.known:
            return self._plan_search_items()
        return Call("get_item", {"item_id": self.rng.choice(list(self.known))})

    def _plan_get_seller_rating(self) -> Call:
        if not self.known:
            return self._plan_search_items()
        item = self.known[self.rng.choice(list(self.known))]
        return Call("get_seller_rating", {"seller_id": item["seller_id"]})

    def _plan_add_to_cart(self) -> Call:
        item_id = self._pick_addable()
        if item_id is None:
            return self._plan_search_items()
        room = self.known[item_id]["quantity"] - self.cart.get(item_id, 0)
        return Call("add_to_cart", {"item_id": item_id, "quantity": self.rng.randint(1, min(2, room))})

    def _pick_addable(self) -> int | None:
        """A known item with units left to add, uniformly; None if there is none.

        One draw over all known items is almost always addable; only when it is not is
        the list of addable ones built (a draw among them: the same distribution)."""
        if not self.known:
            return None
        item_id = self.rng.choice(list(self.known))
        if self.known[item_id]["quantity"] > self.cart.get(item_id, 0):
            return item_id
        addable = [i for i, item in self.known.items() if item["quantity"] > self.cart.get(i, 0)]
        return self.rng.choice(addable) if addable else None

    def _plan_remove_from_cart(self) -> Call:
        if not self.cart:
            return Call("display_cart")
        return Call("remove_from_cart", {"item_id": self.rng.choice(list(self.cart)), "quantity": 1})

    def _plan_make_purchase(self) -> Call:
        if not self.cart:
            return self._plan_add_to_cart()
        self._purchases += 1
        return Call("make_purchase", {**CARD, "idempotency_key": f"{self.username}-{self._purchases}"})

    def _plan_provide_feedback(self) -> Call:
        if not self.unrated:
            return self._plan_get_purchase_history()
        item_id = self.unrated.pop(self.rng.randrange(len(self.unrated)))
        vote = "up" if self.rng.random() < 0.8 else "down"
        return Call("provide_feedback", {"item_id": item_id, "vote": vote})

    def _plan_get_purchase_history(self) -> Call:
        return Call("get_purchase_history", {"limit": 20})

    def _saw_search_items(self, call: Call, result: dict[str, Any]) -> None:
        for item in result["items"]:
            self.known.pop(item["item_id"], None)
            self.known[item["item_id"]] = item
        while len(self.known) > KNOWN_ITEMS:
            del self.known[next(iter(self.known))]

    def _saw_get_item(self, call: Call, result: dict[str, Any]) -> None:
        if result["quantity"] > 0:
            self.known[result["item_id"]] = result
        else:
            self.known.pop(result["item_id"], None)

    def _saw_cart(self, call: Call, result: dict[str, Any]) -> None:
        self.cart = {line["item_id"]: line["quantity"] for line in result["cart"]["items"]}

    _saw_add_to_cart = _saw_remove_from_cart = _saw_clear_cart = _saw_cart

    def _saw_save_cart(self, call: Call, result: dict[str, Any]) -> None:
        self._saw_cart(call, result)
        self.saved = dict(self.cart)

    def _saw_display_cart(self, call: Call, result: dict[str, Any]) -> None:
        self._saw_cart(call, result)
        for line in result["cart"]["items"]:
            short = line["quantity"] - line["available"]
            if short > 0:
                self.pending.append(Call("remove_from_cart", {"item_id": line["item_id"], "quantity": short}))

    def _saw_make_purchase(self, call: Call, result: dict[str, Any]) -> None:
        lines = {line["item_id"]: line["quantity"] for line in result["lines"]}
        self.orders.append(AckedOrder(result["order_id"], self.user_id, lines))
        self.cart, self.saved = {}, {}
        fresh = set(lines) - self.rated - set(self.unrated)
        self.unrated.extend(sorted(fresh))

    def _saw_provide_feedback(self, call: Call, result: dict[str, Any]) -> None:
        self.rated.add(call.args["item_id"])

    def _saw_login(self, call: Call, result: dict[str, Any]) -> None:
        self.cart = dict(self.saved)

    def refused(self, call: Call, error: ProtocolError) -> None:
        """Sold out: forget the item; a purchase short of stock: look at the cart next."""
        if call.op == "add_to_cart":
            self.known.pop(call.args["item_id"], None)
        elif call.op == "make_purchase" and isinstance(error, ConflictError):
            self.pending.append(Call("display_cart"))
        elif call.op == "provide_feedback" and isinstance(error, ConflictError):
            self.rated.add(call.args["item_id"])


def new_item(rng: random.Random, number: int, low: int, high: int) -> dict[str, Any]:
    """put_item's arguments for a seller's `number`th item, with `low` to `high` units."""
    word = rng.choice(KEYWORDS)
    return {"name": f"{LOAD_TEST_PREFIX}{word} {number}", "category": rng.randrange(10),
            "keywords": rng.sample(KEYWORDS, rng.randint(1, 3)),
            "condition": rng.choice(("new", "used")), "price": _price(rng),
            "quantity": rng.randint(low, high)}


def _price(rng: random.Random) -> str:
    return f"{rng.randint(1, 200)}.{rng.randrange(100):02d}"


def make_actor(role: str, username: str, rng: random.Random) -> Actor:
    """A new simulated buyer or seller, its username starting with LOAD_TEST_PREFIX."""
    name = username if username.startswith(LOAD_TEST_PREFIX) else LOAD_TEST_PREFIX + username
    return Buyer(name, rng) if role == "buyer" else Seller(name, rng)


def _redialled(conn: Connection, before: tuple[int, int | None]) -> bool:
    """Whether the call was sent again, or on a new connection where the old one was open."""
    resends, reconnects = before
    return conn.resends > resends or (reconnects is not None and conn.reconnects > reconnects)


def _dropped(call: Call) -> ConnectionLostError:
    """What a call answered on a new connection is: the old one dropped, a simulator error."""
    return ConnectionLostError(f"connection dropped around {call.op}; answered on a new connection")
