"""Alembic environment for flightrec.

`proxy.store.migrate` opens the connection itself (async engine, SQLite or PostgreSQL) and
passes it in `config.attributes["connection"]`; this file then runs the migrations on it.
Run directly by the `alembic` command (developers writing a new revision), it builds an async
engine from `sqlalchemy.url` or `FLIGHTREC_DB_URL` instead.
"""

from __future__ import annotations

import asyncio
import os

from alembic import context
from sqlalchemy.engine import Connection

from proxy.store.engine import create_engine
from proxy.store.tables import metadata

config = context.config


def run_on(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        # SQLite cannot ALTER most things: batch mode recreates the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def url() -> str:
    return (
        config.get_main_option("sqlalchemy.url")
        or os.environ.get("FLIGHTREC_DB_URL")
        or "sqlite+aiosqlite:///flightrec.db"
    )


async def run_standalone() -> None:
    engine = create_engine(url())
    try:
        async with engine.begin() as conn:
            await conn.run_sync(run_on)
    finally:
        await engine.dispose()


if context.is_offline_mode():
    context.configure(url=url(), target_metadata=metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif (connection := config.attributes.get("connection")) is not None:
    run_on(connection)
else:
    asyncio.run(run_standalone())
