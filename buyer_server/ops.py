"""The buyer server: a table of op name -> handler (the db transaction functions)."""
from __future__ import annotations

from functools import partial

from db import Database, accounts, cache, carts, catalog, orders
from db.address_limits import AccountGuards
from wire import BUYER_OPS, __version__
from wire.app import App
from wire.config import Settings

from .payments import CountedProcessor, PaymentProcessor, SimulatedProcessor


def build_app(settings: Settings, db: Database, processor: PaymentProcessor | None = None) -> App:
    """The buyer server's App over a database."""
    policy = accounts.SessionPolicy.from_settings(settings)
    processor = CountedProcessor(processor or SimulatedProcessor(settings.payment_decline_rate))
    handlers = {
        **accounts.account_handlers(db, "buyer", policy,
                                    __version__, AccountGuards.for_settings(settings)),
        "search_items": catalog.search_items,
        "get_item": catalog.get_item,
        "add_to_cart": carts.add_to_cart,
        "remove_from_cart": carts.remove_from_cart,
        "display_cart": carts.display_cart,
        "clear_cart": carts.clear_cart,
        "save_cart": carts.save_cart,
        "make_purchase": partial(orders.make_purchase, charge=processor.charge),
        "provide_feedback": orders.provide_feedback,
        "get_seller_rating": catalog.get_seller_rating,
        "get_purchase_history": orders.get_purchase_history,
    }
    return cache.server_app(settings, BUYER_OPS, handlers, accounts.SessionGate(db, "buyer", policy),
                            accounts.ADDRESSED_OPS)
