"""orders.session_id: the session whose cart a purchase empties, so that a settler completing
a purchase cut off after its capture empties the same cart. Orders made before it have none."""
from alembic import op
from sqlalchemy import inspect, text

revision = "0008_order_sessions"
down_revision = "0007_commit_tokens"


def upgrade() -> None:
    conn = op.get_bind()
    if "session_id" not in {column["name"] for column in inspect(conn).get_columns("orders")}:
        conn.execute(text("ALTER TABLE orders ADD COLUMN session_id BIGINT NULL"))  # frozen
