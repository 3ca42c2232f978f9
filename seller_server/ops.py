"""The seller server: a table of op name -> handler (the db transaction functions)."""
from __future__ import annotations

import functools

from db import Database, accounts, catalog
from runtime.config import Settings
from runtime.logins import ADDRESSED_OPS, AccountGuards, account_handlers
from wire import SELLER_OPS
from wire.app import App


def build_app(settings: Settings, db: Database) -> App:
    """The seller server's App over a database."""
    policy = accounts.SessionPolicy.from_settings(settings)
    handlers = {
        **account_handlers(db, "seller", policy, AccountGuards.for_settings(settings)),
        "get_seller_rating": catalog.get_seller_rating,
        "put_item": functools.partial(catalog.put_item, max_on_sale=settings.max_items_per_seller),
        "change_price": catalog.change_price,
        "remove_item": catalog.remove_item,
        "display_items": catalog.display_items,
    }
    return App(SELLER_OPS, handlers, accounts.SessionGate(db, "seller", policy), ADDRESSED_OPS)
