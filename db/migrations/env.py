"""Alembic's entry point: runs the revisions of versions/ on the connection db.migrations
passes in (config.attributes["connection"]), under the upgrade lock it holds already."""
from alembic import context

from db.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # the alembic command itself: it would skip our lock
    raise SystemExit("error: upgrade databases with `market db upgrade --db-url URL` (it takes the lock)")
# one transaction per revision: a revision done stays done if a later one fails
context.configure(connection=connection, target_metadata=metadata, transaction_per_migration=True)
with context.begin_transaction():
    context.run_migrations()
