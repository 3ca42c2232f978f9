"""The buyer server: a table of op name -> handler (the db transaction functions); the
purchase runs in steps of its own (checkout), settled by a background thread."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from db import Database, accounts, carts, catalog, orders, search
from db.ledger import Ledger
from runtime.config import Settings
from runtime.logins import ADDRESSED_OPS, AccountGuards, account_handlers
from wire import BUYER_OPS
from wire.app import App, Background, Stepwise
from wire.errors import ProtocolError

from .checkout import Checkout, Settler
from .payments import PaymentProcessor, SimulatedProcessor

log = logging.getLogger("market.buyer")


def build_app(settings: Settings, db: Database, processor: PaymentProcessor | None = None) -> App:
    """The buyer server's App over a database; its settler starts with the server."""
    policy = accounts.SessionPolicy.from_settings(settings)
    background: list[Background] = []
    if processor is None:
        ledger = Ledger(Database(settings.payments_url, pool_size=4) if settings.payments_url else db)
        if ledger.database is not db:
            background.append(LedgerDatabase(ledger.database))
        try:
            ledger.create_table()
        except ProtocolError as exc:  # the database is away: made at the first purchase instead
            log.warning("the payment ledger's table could not be checked now: %s", exc)
        processor = SimulatedProcessor(ledger, settings.payment_decline_rate)
    checkout = Checkout(db, processor, settings.test_kill_at)
    background.append(Settler(checkout, settings.settle_period_s, settings.settle_after_s))
    handlers = {
        **account_handlers(db, "buyer", policy, AccountGuards.for_settings(settings)),
        "search_items": search.search_items,
        "get_item": catalog.get_item,
        "add_to_cart": carts.add_to_cart,
        "remove_from_cart": carts.remove_from_cart,
        "display_cart": carts.display_cart,
        "clear_cart": carts.clear_cart,
        "save_cart": carts.save_cart,
        "make_purchase": Stepwise(checkout.make_purchase),
        "provide_feedback": orders.provide_feedback,
        "get_seller_rating": catalog.get_seller_rating,
        "get_purchase_history": orders.get_purchase_history,
    }
    app = App(BUYER_OPS, handlers, accounts.SessionGate(db, "buyer", policy), ADDRESSED_OPS,
              background)
    app.checkout = checkout  # type: ignore[attr-defined]  # for tests and tools that settle now
    return app


@dataclass
class LedgerDatabase:
    """The ledger's own database (MARKET_PAYMENTS_URL), closed when the server stops."""

    database: Database

    def start(self) -> None:
        """Nothing to start: the ledger opens connections as it needs them."""

    def stop(self) -> None:
        """Close the ledger's connections."""
        self.database.close()
