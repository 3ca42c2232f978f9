"""The operator's commands: suspensions and admin_actions (operate.admin)."""
import sqlalchemy as sa
from alembic import op

revision = "0006_admin"
down_revision = "0005_item_words"

# frozen here: db/schema.py's tables may move on. Each is created only if missing: on MySQL a
# CREATE TABLE ends the transaction, and two servers may upgrade at once.
_MYSQL = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # SQLite auto-increments INTEGER keys only


def upgrade() -> None:
    op.create_table(
        "suspensions",
        sa.Column("user_id", sa.BigInteger, sa.ForeignKey("users.user_id"), primary_key=True,
                  autoincrement=False),
        sa.Column("suspended_ms", sa.BigInteger, nullable=False),
        sa.Column("reason", sa.String(500), nullable=True),
        if_not_exists=True, **_MYSQL,
    )
    op.create_table(
        "admin_actions",
        sa.Column("action_id", _ID, primary_key=True, autoincrement=True),
        sa.Column("at_ms", sa.BigInteger, nullable=False),
        sa.Column("os_user", sa.String(64), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("target", sa.String(100), nullable=False),
        sa.Column("outcome", sa.String(500), nullable=False),
        sa.Column("reason", sa.String(500), nullable=True),
        if_not_exists=True, **_MYSQL,
    )
