"""commit_tokens: one row per MySQL/MariaDB write transaction, so that a COMMIT whose answer
was lost with its connection is known to have committed or not (db.commit_tokens)."""
import sqlalchemy as sa
from alembic import op

revision = "0007_commit_tokens"
down_revision = "0006_admin"


def upgrade() -> None:
    # frozen here: db/schema.py's table may move on
    op.create_table(
        "commit_tokens",
        sa.Column("created_ms", sa.BigInteger, nullable=False, autoincrement=False),
        sa.Column("nonce", sa.BigInteger, nullable=False, autoincrement=False),
        sa.PrimaryKeyConstraint("created_ms", "nonce"),
        mysql_engine="InnoDB", mysql_charset="utf8mb4", mysql_collate="utf8mb4_bin",
        if_not_exists=True,
    )
