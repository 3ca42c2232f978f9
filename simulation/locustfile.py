"""Locust users for the marketplace, speaking the TCP protocol through wire.Connection.

Every call is reported through locust's request event: name = op, response time,
response length (the result's JSON), and the error as the exception. A CONFLICT from a
race for the last units (add_to_cart, make_purchase, remove_item) is correct behaviour:
it is reported as a success named "OP (CONFLICT)". Buyers and sellers behave as in
market-sim (simulation.behaviour); their task weights are the default mix rounded to
whole numbers, at least 1, so browsing dominates and some sessions check out.

    MARKET_BUYER_ADDR=127.0.0.1:7001 MARKET_SELLER_ADDR=127.0.0.1:7002 \\
    locust -f simulation/locustfile.py --headless -u 20 -r 5 -t 60s --csv out/locust --html out/locust.html

MARKET_LOCUST_THINK_S sets a think time: each user waits a random 0..THINK_S seconds
between calls (default 0). Locust always drives servers it did not start: it runs only with
MARKET_LOCUST_ALLOW_LIVE=1 (its accounts and items are named loadtest-...).
"""
from __future__ import annotations

import json
import random
import secrets
import sys
from collections.abc import Callable

from locust import User, between

from runtime.config import env
from simulation.behaviour import LIVE_DATA_WARNING, Call, make_actor
from simulation.mixes import DEFAULT
from simulation.servers import parse_address
from wire import Connection

if env("MARKET_LOCUST_ALLOW_LIVE", "") not in ("1", "true", "yes"):
    sys.exit(f"locust: {LIVE_DATA_WARNING}; set MARKET_LOCUST_ALLOW_LIVE=1 to go ahead")

THINK_S = float(env("MARKET_LOCUST_THINK_S", "0"))  # .env too, as everywhere
ADDRESS_ENV = {"buyer": ("MARKET_BUYER_ADDR", "127.0.0.1:7001"),
               "seller": ("MARKET_SELLER_ADDR", "127.0.0.1:7002")}


def _task(op: str) -> Callable[[MarketUser], None]:
    def run(user: MarketUser) -> None:
        user.act(op)

    run.__name__ = op
    return run


def _tasks(role: str) -> dict[Callable[[MarketUser], None], int]:
    return {_task(op): max(1, round(weight)) for op, weight in DEFAULT.weights(role).items()}


class MarketUser(User):
    """One simulated user with its own connection; subclasses pick the role."""

    abstract = True
    role = ""
    wait_time = between(0, THINK_S)

    def on_start(self) -> None:
        """Connect, create an account, log in, and seed (sellers list stock)."""
        variable, default = ADDRESS_ENV[self.role]
        self.conn = Connection(*parse_address(env(variable, default)))
        self.actor = make_actor(self.role, f"{self.role[0]}lc{secrets.token_hex(6)}", random.Random())
        for call in self.actor.setup_calls():
            self.perform(call, setup=True)

    def on_stop(self) -> None:
        """Close the connection."""
        self.conn.close()

    def act(self, op: str) -> None:
        """Make the call the mix's `op` leads to now."""
        self.perform(self.actor.next_call(op))

    def perform(self, call: Call, setup: bool = False) -> None:
        """Make one call and report it to locust (a set-up call is tried again while BUSY)."""
        outcome = (self.actor.perform_setup if setup else self.actor.perform)(self.conn, call)
        self.environment.events.request.fire(
            request_type=self.role,
            name=f"{call.op} (CONFLICT)" if outcome.kind == "conflict" else call.op,
            response_time=outcome.latency_s * 1000,
            response_length=len(json.dumps(outcome.result)) if outcome.result is not None else 0,
            exception=outcome.error if outcome.kind not in ("ok", "conflict") else None,
            context={"user": self.actor.username},
        )


class BuyerUser(MarketUser):
    """Browse-heavy: searches and item pages dominate; carts, purchases and feedback follow."""

    role = "buyer"
    tasks = _tasks("buyer")  # type: ignore[assignment]  # locust takes a weight dict too


class SellerUser(MarketUser):
    """Checks its listings and rating, lists, reprices and removes stock."""

    role = "seller"
    tasks = _tasks("seller")  # type: ignore[assignment]
