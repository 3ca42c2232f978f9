"""device_tokens: the clients that logged in to an account, which its login throttle never
slows (db.login_throttle); only each token's SHA-256 is kept."""
import sqlalchemy as sa
from alembic import op

revision = "0009_device_tokens"
down_revision = "0008_order_sessions"


def upgrade() -> None:
    if sa.inspect(op.get_bind()).has_table("device_tokens"):
        return
    # frozen here: db/schema.py's table may move on
    op.create_table(
        "device_tokens",
        sa.Column("token_hash", sa.String(64), primary_key=True),
        sa.Column("user_id", sa.BigInteger, sa.ForeignKey("users.user_id"), nullable=False, index=True),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        mysql_engine="InnoDB", mysql_charset="utf8mb4", mysql_collate="utf8mb4_bin",
    )
