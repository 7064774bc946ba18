"""Alembic driven from code: no alembic.ini, the same path for a checkout and an installed wheel.

The migration scripts live in `<repo>/migrations`; the wheel ships them as `proxy/_migrations`
(pyproject force-include). Migrations run on a connection we open ourselves and hand to
`migrations/env.py` through `Config.attributes`, so one async code path serves SQLite and
PostgreSQL, and the CLI and `serve` share it.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from proxy.store.engine import StoreError, check_connection, create_engine, describe, safe_url

# Any constant works; it only has to be the same in every flightrec process sharing a database.
_PG_MIGRATION_LOCK = 0x666C6974


def scripts_dir() -> Path:
    """Where the migration scripts are: the installed copy first, then the checkout."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise StoreError(f"migration scripts not found (looked in {package}/_migrations)")


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(scripts_dir()))
    return config


def head() -> str:
    """The newest revision the scripts define."""
    revision = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if revision is None:
        raise StoreError("migration scripts define no revision")
    return revision


async def current(conn: AsyncConnection) -> str | None:
    """The revision the database is at; None for an empty database."""

    def read(sync_conn: Connection) -> str | None:
        return MigrationContext.configure(sync_conn).get_current_revision()

    return await conn.run_sync(read)


async def upgrade(url: str, revision: str = "head") -> None:
    await _run(url, "upgrade", revision)


async def downgrade(url: str, revision: str = "base") -> None:
    await _run(url, "downgrade", revision)


async def check_head(engine: AsyncEngine) -> None:
    """Raise `StoreError` unless the schema is at head (for `serve` without auto_upgrade)."""
    async with engine.connect() as conn:
        at = await current(conn)
    if at != head():
        raise StoreError(
            f"the database at {safe_url(engine.url.render_as_string(hide_password=False))} "
            f"is at schema revision {at or 'none'}, expected {head()}: run `flightrec db upgrade`"
        )


async def prepare(engine: AsyncEngine, url: str, auto_upgrade: bool) -> None:
    """Before `serve` writes: upgrade the schema to head (`auto_upgrade`), else check it is
    there. Raises `StoreError`, `Unreachable` when the server did not answer."""
    if auto_upgrade:
        await upgrade(url)
    await check_connection(engine)
    if not auto_upgrade:
        await check_head(engine)


async def _run(url: str, direction: str, revision: str) -> None:
    engine = create_engine(url)
    try:
        await check_connection(engine)
        config = alembic_config()
        try:
            async with engine.connect() as conn:
                sqlite = conn.dialect.name == "sqlite"
                if sqlite:
                    # SQLite drops a column by building the table anew and dropping the old
                    # one (alembic's batch mode); with foreign keys on, dropping `exchanges`
                    # would delete every child row through ON DELETE CASCADE. The pragma only
                    # takes effect outside a transaction.
                    await conn.exec_driver_sql("PRAGMA foreign_keys = OFF")
                    await conn.commit()
                try:
                    async with conn.begin():
                        if conn.dialect.name == "postgresql":
                            # Several proxies may start at once against one database: the
                            # first migrates, the others wait here and then find it at head.
                            await conn.execute(
                                sa.text("SELECT pg_advisory_xact_lock(:key)"),
                                {"key": _PG_MIGRATION_LOCK},
                            )
                        await conn.run_sync(_command, config, direction, revision)
                finally:
                    if sqlite:
                        await conn.exec_driver_sql("PRAGMA foreign_keys = ON")
                        await conn.commit()
        except (sa.exc.SQLAlchemyError, CommandError) as exc:
            raise StoreError(
                f"migration {direction} to {revision} failed: {describe(exc)}"
            ) from None
    finally:
        await engine.dispose()


def _command(sync_conn: Connection, config: Config, direction: str, revision: str) -> None:
    config.attributes["connection"] = sync_conn
    if direction == "upgrade":
        command.upgrade(config, revision)
    else:
        command.downgrade(config, revision)
