"""The operator's commands: suspensions and admin_actions (db.admin)."""
from alembic import op

from db.operator_tables import upgrade as add_operator_tables

revision = "0006_admin"
down_revision = "0005_item_words"


def upgrade() -> None:
    add_operator_tables(op.get_bind())
