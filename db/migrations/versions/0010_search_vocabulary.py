"""Search by text of protocol 1.2: item_words made again with category names, stems and the
characters of scripts without spaces (at most 12 words an item), the vocabulary that typos are
matched against, and item_word_pairs dropped; ix_items_seller_on_sale counts a seller's items on
sale (the cap on listings)."""
from alembic import op
from sqlalchemy import inspect, text

from db.migrations.item_words import upgrade as index_item_words

revision = "0010_search_vocabulary"
down_revision = "0009_device_tokens"


def upgrade() -> None:
    conn = op.get_bind()
    index_item_words(conn)
    if "ix_items_seller_on_sale" not in {index["name"] for index in inspect(conn).get_indexes("items")}:
        conn.execute(text("CREATE INDEX ix_items_seller_on_sale ON items (seller_id, quantity)"))  # frozen
