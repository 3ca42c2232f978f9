"""The revisions, oldest first by their down_revision (Alembic reads every module here)."""
