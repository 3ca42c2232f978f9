"""Purchases in steps (db.purchases): orders.status and orders.payment_key, with their indexes.

Orders made before it are paid (the status's server default) and have no key; the payment
ledger's own table is made by the buyer servers' processor (db.ledger), not here."""
from alembic import op
from sqlalchemy import Connection, inspect, text

revision = "0004_payments"
down_revision = "schema3"

# frozen: the columns as this revision adds them
_COLUMNS = (("status", "VARCHAR(9) NOT NULL DEFAULT 'paid'"), ("payment_key", "VARCHAR(64) NULL"))


def upgrade() -> None:
    conn = op.get_bind()
    _add_columns(conn)
    indexes = {index["name"] for index in inspect(conn).get_indexes("orders")}
    if "uq_orders_payment_key" not in indexes:
        conn.execute(text("CREATE UNIQUE INDEX uq_orders_payment_key ON orders (payment_key)"))
    if "ix_orders_status" not in indexes:
        conn.execute(text("CREATE INDEX ix_orders_status ON orders (status, created_ms)"))


def _add_columns(conn: Connection) -> None:
    """Each column unless there already (a database made by a build that had it)."""
    present = {column["name"] for column in inspect(conn).get_columns("orders")}
    for name, ddl in _COLUMNS:
        if name not in present:
            conn.execute(text(f"ALTER TABLE orders ADD COLUMN {name} {ddl}"))
