"""Alembic environment for chatkeep's schema: runs on the connection (or offline, for the dialect) chatkeep gives."""

from __future__ import annotations

from alembic import context

from chatkeep.sql._schema import VERSION_TABLE

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    # Offline mode (alembic upgrade --sql): print the DDL for the dialect named in the config.
    context.configure(
        dialect_name=config.attributes.get("dialect_name", "postgresql"),
        version_table=VERSION_TABLE,
        literal_binds=True,
    )
else:
    context.configure(connection=connection, version_table=VERSION_TABLE)

with context.begin_transaction():
    context.run_migrations()
