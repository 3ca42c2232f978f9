"""Schema version 2: the search index holds items on sale only."""
from alembic import op
from sqlalchemy import delete, select, update

from db.schema import item_keywords, items, schema_info

revision = "schema2"
down_revision = "schema1"


def upgrade() -> None:
    conn = op.get_bind()
    conn.execute(delete(item_keywords).where(
        item_keywords.c.item_id.in_(select(items.c.item_id).where(items.c.quantity == 0))))
    conn.execute(update(schema_info).values(version=2))
