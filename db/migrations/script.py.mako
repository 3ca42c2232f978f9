"""${message}"""
from alembic import op

revision = "${up_revision}"
down_revision = ${'"%s"' % down_revision if down_revision else "None"}


def upgrade() -> None:
    # op.get_bind() is a SQLAlchemy Connection in this revision's own transaction
    raise NotImplementedError(f"write the schema change: a module's upgrade(conn), or op.*; {op}")
