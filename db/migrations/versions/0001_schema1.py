"""Schema version 1, the oldest a release before migrations could still upgrade: every table
but item_keyword_pairs. Its tables are written out here, frozen: db/schema.py moves on.

A new database gets what the releases before migrations made of one (create_all at their last
version): keywords and idempotency keys VARBINARY on MySQL, and ix_item_keywords_item (without it
MySQL makes an index of its own for the foreign key). schema3's steps find those done."""
from typing import Any

from alembic import op
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
    UniqueConstraint,
)

from db.schema import ExactText, Id, Username

revision = "schema1"
down_revision = None

_MYSQL: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4",
                          "mysql_collate": "utf8mb4_bin"}


def _counter(name: str) -> Column[int]:
    return Column(name, BigInteger, nullable=False, default=0, server_default="0")


def _tables() -> MetaData:
    """The schema of version 1, as its create_all made it."""
    md = MetaData()
    Table("schema_info", md, Column("version", Integer, primary_key=True, autoincrement=False), **_MYSQL)
    Table("users", md,
          Column("user_id", Id, primary_key=True, autoincrement=True),
          Column("role", String(6), nullable=False),
          Column("username", Username, nullable=False),
          Column("name", String(32), nullable=False),
          Column("password_hash", String(200), nullable=False),
          _counter("thumbs_up"), _counter("thumbs_down"), _counter("items_sold"),
          Column("created_ms", BigInteger, nullable=False),
          UniqueConstraint("role", "username", name="uq_users_role_username"), **_MYSQL)
    Table("sessions", md,
          Column("session_id", Id, primary_key=True, autoincrement=True),
          Column("token_hash", String(64), nullable=False, unique=True),
          Column("user_id", BigInteger, ForeignKey("users.user_id"), nullable=False, index=True),
          Column("role", String(6), nullable=False),
          Column("created_ms", BigInteger, nullable=False),
          Column("last_seen_ms", BigInteger, nullable=False), **_MYSQL)
    Table("items", md,
          Column("item_id", Id, primary_key=True, autoincrement=True),
          Column("seller_id", BigInteger, ForeignKey("users.user_id"), nullable=False),
          Column("name", String(32), nullable=False),
          Column("category", SmallInteger, nullable=False),
          Column("keywords", Text, nullable=False),
          Column("item_condition", String(4), nullable=False),
          Column("price_cents", BigInteger, nullable=False),
          Column("quantity", BigInteger, nullable=False),
          _counter("listed"), _counter("sold"), _counter("removed"),
          _counter("thumbs_up"), _counter("thumbs_down"),
          Column("created_ms", BigInteger, nullable=False),
          Index("ix_items_seller", "seller_id", "item_id"),
          Index("ix_items_category", "category", "item_id"), **_MYSQL)
    Table("item_keywords", md,
          Column("keyword", ExactText(8), nullable=False),
          Column("item_id", BigInteger, ForeignKey("items.item_id"), nullable=False),
          Column("category", SmallInteger, nullable=False),
          PrimaryKeyConstraint("keyword", "item_id"),
          Index("ix_item_keywords_category", "keyword", "category", "item_id"),
          Index("ix_item_keywords_item", "item_id"), **_MYSQL)
    for name, owner in (("cart_lines", ("session_id", "sessions.session_id")),
                        ("saved_cart_lines", ("buyer_id", "users.user_id"))):
        Table(name, md,
              Column(owner[0], BigInteger, ForeignKey(owner[1]), nullable=False),
              Column("item_id", BigInteger, ForeignKey("items.item_id"), nullable=False),
              Column("quantity", BigInteger, nullable=False),
              PrimaryKeyConstraint(owner[0], "item_id"), **_MYSQL)
    Table("orders", md,
          Column("order_id", Id, primary_key=True, autoincrement=True),
          Column("buyer_id", BigInteger, ForeignKey("users.user_id"), nullable=False),
          Column("total_cents", BigInteger, nullable=False),
          Column("idempotency_key", ExactText(128), nullable=True),
          Column("created_ms", BigInteger, nullable=False),
          UniqueConstraint("buyer_id", "idempotency_key", name="uq_orders_idempotency"),
          Index("ix_orders_buyer", "buyer_id", "order_id"), **_MYSQL)
    Table("order_lines", md,
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
          Index("ix_order_lines_seller", "seller_id"), **_MYSQL)
    Table("feedback", md,
          Column("buyer_id", BigInteger, ForeignKey("users.user_id"), nullable=False),
          Column("item_id", BigInteger, ForeignKey("items.item_id"), nullable=False),
          Column("vote", String(4), nullable=False),
          Column("created_ms", BigInteger, nullable=False),
          PrimaryKeyConstraint("buyer_id", "item_id"), **_MYSQL)
    Table("login_failures", md,
          Column("role", String(6), nullable=False),
          Column("username", Username, nullable=False),
          Column("failures", Integer, nullable=False),
          Column("last_failure_ms", BigInteger, nullable=False),
          PrimaryKeyConstraint("role", "username"), **_MYSQL)
    return md


def upgrade() -> None:
    conn = op.get_bind()
    tables = _tables()
    tables.create_all(conn)
    # the version a release before migrations reads: it refuses nothing older than itself
    conn.execute(tables.tables["schema_info"].insert().values(version=1))
