"""The search by text's word indexes (item_words, item_word_pairs), made and filled from every
item on sale, so that items listed before the upgrade are found by name."""
from alembic import op

from db.migrations.item_words import upgrade as index_item_words

revision = "0005_item_words"
down_revision = "0004_payments"


def upgrade() -> None:
    index_item_words(op.get_bind())
