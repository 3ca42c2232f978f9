"""The ops of PROTOCOL.md: for each, its arguments, whether it is public, and
whether it writes. Servers pair these specs with handlers; clients may use them
to check arguments before sending.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from . import values as v
from .errors import BadRequestError


@dataclass(frozen=True)
class OpSpec:
    """What one op accepts."""

    name: str
    required: dict[str, v.Validator] = field(default_factory=dict)
    optional: dict[str, v.Validator] = field(default_factory=dict)
    public: bool = False
    writes: bool = False
    defaults: dict[str, Any] = field(default_factory=dict)
    exclusive: tuple[str, ...] = ()  # optional fields of which at most one may be given

    def validate(self, args: dict[str, Any]) -> dict[str, Any]:
        """Normalised args; BadRequestError names the first faulty field."""
        for key in args:
            if key not in self.required and key not in self.optional:
                raise BadRequestError(f"{key}: unknown field for {self.name}")
        given = [key for key in self.exclusive if args.get(key) is not None]
        if len(given) > 1:
            raise BadRequestError(f"{given[1]}: not with {given[0]}; give one of them")
        out = dict(self.defaults)
        for key, check in self.required.items():
            if key not in args:
                raise BadRequestError(f"{key}: required")
            out[key] = check(key, args[key])
        for key, check in self.optional.items():
            if key in args and args[key] is not None:
                out[key] = check(key, args[key])
        return out


def _specs(*specs: OpSpec) -> dict[str, OpSpec]:
    return {spec.name: spec for spec in specs}


_PAGE = {"limit": v.limit, "cursor": v.cursor}
_PAGE_DEFAULTS = {"limit": 50, "cursor": None}

COMMON_OPS = _specs(
    OpSpec("ping", public=True),
    OpSpec("create_account", {"username": v.username, "password": v.password,
                              "name": v.person_name}, public=True, writes=True),
    OpSpec("login", {"username": v.username, "password": v.password},
           {"device_token": v.text(1, 128)}, public=True, writes=True),
    OpSpec("logout", writes=True),
)

SELLER_OPS = COMMON_OPS | _specs(
    OpSpec("get_seller_rating"),
    OpSpec("put_item", {"name": v.item_name, "category": v.category, "keywords": v.keywords,
                        "condition": v.condition, "price": v.money, "quantity": v.quantity},
           writes=True),
    OpSpec("change_price", {"item_id": v.object_id, "price": v.money}, writes=True),
    OpSpec("remove_item", {"item_id": v.object_id, "quantity": v.quantity}, writes=True),
    OpSpec("display_items", optional=_PAGE, defaults=_PAGE_DEFAULTS),
)

BUYER_OPS = COMMON_OPS | _specs(
    OpSpec("search_items", optional={"category": v.category, "keywords": v.keywords, "query": v.query,
                                     **_PAGE},
           defaults={"category": None, "keywords": [], "query": [], **_PAGE_DEFAULTS},
           exclusive=("keywords", "query")),
    OpSpec("get_item", {"item_id": v.object_id}),
    OpSpec("add_to_cart", {"item_id": v.object_id, "quantity": v.quantity}, writes=True),
    OpSpec("remove_from_cart", {"item_id": v.object_id, "quantity": v.quantity}, writes=True),
    OpSpec("display_cart"),
    OpSpec("clear_cart", writes=True),
    OpSpec("save_cart", writes=True),
    OpSpec("make_purchase", {"card_name": v.card_name, "card_number": v.card_number,
                             "card_expiry": v.card_expiry},
           {"idempotency_key": v.idempotency_key, "expected_total": v.total}, writes=True,
           defaults={"idempotency_key": None}),
    OpSpec("provide_feedback", {"item_id": v.object_id, "vote": v.vote}, writes=True),
    OpSpec("get_seller_rating", {"seller_id": v.object_id}),
    OpSpec("get_purchase_history", optional=_PAGE, defaults=_PAGE_DEFAULTS),
)

READ_ONLY_OPS = frozenset(name for name, spec in (BUYER_OPS | SELLER_OPS).items() if not spec.writes)
