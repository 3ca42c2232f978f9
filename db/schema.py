"""The marketplace's tables (each schema version is a revision in db/migrations/versions).

Money is integer cents, times are integer epoch milliseconds, and every id is chosen by the
database. Uniqueness rules the protocol relies on are constraints here, never read-then-write
checks in Python.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Table,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.mysql import VARBINARY
from sqlalchemy.engine import Dialect
from sqlalchemy.schema import SchemaItem
from sqlalchemy.types import TypeEngine

from wire.values import MAX_WORD_LENGTH, TYPO_LENGTH, item_search_words, stem

metadata = MetaData()

# SQLite only auto-increments an INTEGER PRIMARY KEY; MySQL gets BIGINT.
Id = BigInteger().with_variant(Integer(), "sqlite")
# Usernames compare case-sensitively on every database (SQLite does by default).
Username = String(32).with_variant(String(32, collation="utf8mb4_bin"), "mysql", "mariadb")
MYSQL_OPTIONS: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4",
                                 "mysql_collate": "utf8mb4_bin"}


def _table(name: str, *parts: SchemaItem) -> Table:
    return Table(name, metadata, *parts, **MYSQL_OPTIONS)


class ExactText(TypeDecorator[str]):
    """Text compared character for character on every database. MySQL's `_bin` collations
    ignore trailing spaces ("a" = "a "), which would make two keywords one (a duplicate key)
    and replay one idempotency key's purchase for another: there it is VARBINARY, UTF-8
    bytes compared as they are. SQLite compares text exactly already."""

    impl = String
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):  # up to four bytes a character in UTF-8
            return dialect.type_descriptor(VARBINARY(4 * self.length))
        return dialect.type_descriptor(String(self.length))

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return value.encode() if isinstance(value, str) and dialect.name in ("mysql", "mariadb") else value

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        return value.decode() if isinstance(value, bytes | bytearray) else value


def _counter(name: str) -> Column[int]:
    return Column(name, BigInteger, nullable=False, server_default="0")


schema_info = _table("schema_info", Column("version", Integer, primary_key=True, autoincrement=False))

users = _table(
    "users",
    Column("user_id", Id, primary_key=True, autoincrement=True),
    Column("role", String(6), nullable=False),
    Column("username", Username, nullable=False),
    Column("name", String(32), nullable=False),
    Column("password_hash", String(200), nullable=False),
    _counter("thumbs_up"), _counter("thumbs_down"), _counter("items_sold"),
    Column("created_ms", BigInteger, nullable=False),
    UniqueConstraint("role", "username", name="uq_users_role_username"),
)

sessions = _table(
    "sessions",
    Column("session_id", Id, primary_key=True, autoincrement=True),
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("user_id", BigInteger, ForeignKey("users.user_id"), nullable=False, index=True),
    Column("role", String(6), nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    Column("last_seen_ms", BigInteger, nullable=False),
)

items = _table(
    "items",
    Column("item_id", Id, primary_key=True, autoincrement=True),
    Column("seller_id", BigInteger, ForeignKey("users.user_id"), nullable=False),
    Column("name", String(32), nullable=False),
    Column("category", SmallInteger, nullable=False),
    Column("keywords", Text, nullable=False),  # JSON list, as given (lower-cased)
    Column("item_condition", String(4), nullable=False),
    Column("price_cents", BigInteger, nullable=False),
    Column("quantity", BigInteger, nullable=False),  # on sale now
    _counter("listed"), _counter("sold"), _counter("removed"),  # listed = quantity + sold + removed
    _counter("thumbs_up"), _counter("thumbs_down"),
    Column("created_ms", BigInteger, nullable=False),
    Index("ix_items_seller", "seller_id", "item_id"),
    Index("ix_items_seller_on_sale", "seller_id", "quantity"),  # the cap on listings (db.catalog.put_item)
    Index("ix_items_category", "category", "item_id"),
)

def _word_index(name: str, word: str, length: int) -> Table:
    """A search index: the items on sale that have a word, and their category."""
    return _table(
        name,
        Column(word, ExactText(length), nullable=False),
        Column("item_id", BigInteger, ForeignKey("items.item_id"), nullable=False),
        Column("category", SmallInteger, nullable=False),  # an item's category never changes
        PrimaryKeyConstraint(word, "item_id"),
        Index(f"ix_{name}_category", word, "category", "item_id"),
        Index(f"ix_{name}_item", "item_id"),  # unlisting
    )


item_keywords = _word_index("item_keywords", "keyword", 8)

# Every pair of an item on sale's keywords (keyword_pairs): the items with both keywords of a
# two-keyword search, in item order, without reading either keyword's whole range, and the
# rank of every item with two or more keywords of a longer search's first page. No category:
# a search with one uses the grouped statement (db.search._two_keyword_search).
item_keyword_pairs = _table(
    "item_keyword_pairs",
    Column("first_keyword", ExactText(8), nullable=False),
    Column("second_keyword", ExactText(8), nullable=False),
    Column("item_id", BigInteger, ForeignKey("items.item_id"), nullable=False),
    PrimaryKeyConstraint("first_keyword", "second_keyword", "item_id"),
    Index("ix_item_keyword_pairs_item", "item_id"),
)


def keyword_rows(item_id: int, category: int, keywords: Iterable[str]) -> list[dict[str, Any]]:
    """The item_keywords rows of one item on sale."""
    return [{"keyword": word, "item_id": item_id, "category": category} for word in keywords]


def keyword_pairs(keywords: Iterable[str]) -> list[tuple[str, str]]:
    """Each pair of the keywords once, in order: as item_keyword_pairs holds them."""
    return list(itertools.combinations(sorted(keywords), 2))


def keyword_pair_rows(item_id: int, keywords: Iterable[str]) -> list[dict[str, Any]]:
    """The item_keyword_pairs rows of one item on sale."""
    return [{"first_keyword": first, "second_keyword": second, "item_id": item_id}
            for first, second in keyword_pairs(keywords)]


# The search by text's index: an item on sale's words (wire.values.item_search_words: its
# category's name, the folded words of its name and one-word keywords, at most 12), each once,
# and "~" + the stem of each whose stem differs (a query word's stem finds them). Kept like
# item_keywords: written by put_item, deleted when the item sells out.
item_words = _word_index("item_words", "word", MAX_WORD_LENGTH + 1)

# Every word of letters only, of TYPO_LENGTH - 1 letters or more, that an item ever brought into
# item_words (never deleted): what a query word's typos are matched against. A word one edit
# from another shares with it the first or the last (n - 1) // 2 letters (n: the longer's
# length), so the candidates are two ranges per length: by word and by its letters reversed.
vocabulary = _table(
    "vocabulary",
    Column("length", SmallInteger, nullable=False),
    Column("word", ExactText(MAX_WORD_LENGTH), nullable=False),
    Column("tail", ExactText(MAX_WORD_LENGTH), nullable=False),  # the word reversed
    PrimaryKeyConstraint("length", "word"),
    Index("ix_vocabulary_tail", "length", "tail"),
)


def word_rows(item_id: int, category: int, name: str, keywords: list[str]) -> list[dict[str, Any]]:
    """The item_words rows of one item on sale: its words, then "~" + each differing stem."""
    words = item_search_words(name, keywords, category)
    words += dict.fromkeys(f"~{stem(word)}" for word in words if stem(word) != word)
    return [{"word": word, "item_id": item_id, "category": category} for word in words]


def vocabulary_rows(words: Iterable[str]) -> list[dict[str, Any]]:
    """The vocabulary rows of an item's words (word_rows), in key order."""
    kept = sorted((len(word), word) for word in words if len(word) >= TYPO_LENGTH - 1 and word.isalpha())
    return [{"length": length, "word": word, "tail": word[::-1]} for length, word in kept]


def _cart(name: str, owner: str, owner_key: str) -> Table:
    return _table(
        name,
        Column(owner, BigInteger, ForeignKey(owner_key), nullable=False),
        Column("item_id", BigInteger, ForeignKey("items.item_id"), nullable=False),
        Column("quantity", BigInteger, nullable=False),
        PrimaryKeyConstraint(owner, "item_id"),
    )


cart_lines = _cart("cart_lines", "session_id", "sessions.session_id")
saved_cart_lines = _cart("saved_cart_lines", "buyer_id", "users.user_id")

orders = _table(
    "orders",
    Column("order_id", Id, primary_key=True, autoincrement=True),
    Column("buyer_id", BigInteger, ForeignKey("users.user_id"), nullable=False),
    Column("total_cents", BigInteger, nullable=False),
    Column("idempotency_key", ExactText(128), nullable=True),
    Column("created_ms", BigInteger, nullable=False),
    # pending -> paid, or pending -> voiding -> void (db.purchases; capturing: a purchase of
    # revision 0006 or older, captured after it was marked bought); orders made before schema
    # version 4 are paid, without a payment key
    Column("status", String(9), nullable=False, default="pending", server_default="paid"),
    Column("payment_key", String(64), nullable=True),  # the processor's key, made per order
    # the session whose cart the purchase empties (none before revision 0007; no foreign key:
    # sessions end and are deleted, their orders stay)
    Column("session_id", BigInteger, nullable=True),
    UniqueConstraint("buyer_id", "idempotency_key", name="uq_orders_idempotency"),
    Index("uq_orders_payment_key", "payment_key", unique=True),  # as revision 0004 makes it
    Index("ix_orders_buyer", "buyer_id", "order_id"),
    Index("ix_orders_status", "status", "created_ms"),
)

order_lines = _table(
    "order_lines",
    Column("order_id", BigInteger, ForeignKey("orders.order_id"), nullable=False),
    Column("item_id", BigInteger, ForeignKey("items.item_id"), nullable=False),
    Column("buyer_id", BigInteger, nullable=False),
    Column("seller_id", BigInteger, nullable=False),
    Column("name", String(32), nullable=False),
    Column("quantity", BigInteger, nullable=False),
    Column("price_cents", BigInteger, nullable=False),
    PrimaryKeyConstraint("order_id", "item_id"),
    Index("ix_order_lines_buyer_item", "buyer_id", "item_id"),
    Index("ix_order_lines_buyer_order", "buyer_id", "order_id"),
    Index("ix_order_lines_seller", "seller_id"),
)

feedback = _table(
    "feedback",
    Column("buyer_id", BigInteger, ForeignKey("users.user_id"), nullable=False),
    Column("item_id", BigInteger, ForeignKey("items.item_id"), nullable=False),
    Column("vote", String(4), nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    PrimaryKeyConstraint("buyer_id", "item_id"),
)

# Consecutive failed logins per account name (existing or not), for the login backoff.
login_failures = _table(
    "login_failures",
    Column("role", String(6), nullable=False),
    Column("username", Username, nullable=False),
    Column("failures", Integer, nullable=False),
    Column("last_failure_ms", BigInteger, nullable=False),
    PrimaryKeyConstraint("role", "username"),
)

# Device tokens (PROTOCOL.md): a client that logged in to the account, which the account's
# throttle never slows (db.login_throttle). Only the token's SHA-256 is kept.
device_tokens = _table(
    "device_tokens",
    Column("token_hash", String(64), primary_key=True),
    Column("user_id", BigInteger, ForeignKey("users.user_id"), nullable=False, index=True),
    Column("created_ms", BigInteger, nullable=False),
)

# Accounts an operator suspended (`market admin suspend`): no login, no session.
suspensions = _table(
    "suspensions",
    Column("user_id", BigInteger, ForeignKey("users.user_id"), primary_key=True, autoincrement=False),
    Column("suspended_ms", BigInteger, nullable=False),
    Column("reason", String(500), nullable=True),
)

# Every operator's action (`market admin`): who ran it from where, when, on what, and why.
admin_actions = _table(
    "admin_actions",
    Column("action_id", Id, primary_key=True, autoincrement=True),
    Column("at_ms", BigInteger, nullable=False),
    Column("os_user", String(64), nullable=False),
    Column("host", String(255), nullable=False),
    Column("action", String(32), nullable=False),
    Column("target", String(100), nullable=False),
    Column("outcome", String(500), nullable=False),
    Column("reason", String(500), nullable=True),
)

# One row per MySQL/MariaDB write transaction, written in it (db.commit_tokens). The key grows
# with time (the housekeeping deletes by its first column); `nonce` is random.
commit_tokens = _table(
    "commit_tokens",
    Column("created_ms", BigInteger, nullable=False, autoincrement=False),
    Column("nonce", BigInteger, nullable=False, autoincrement=False),
    PrimaryKeyConstraint("created_ms", "nonce"),
)
