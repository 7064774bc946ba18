"""The writer the recorder and the tests use for a database: SQLite's or PostgreSQL's."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.store.engine import SQLITE_BUSY_TIMEOUT_MS, StoreError
from proxy.store.pg_writer import PgWriter
from proxy.store.rows import Rows
from proxy.store.sqlite_writer import SqliteWriter
from proxy.store.turns import steady


class Writer(Protocol):
    async def write(self, batch: Sequence[Rows]) -> int:
        """Write a batch in one transaction, each exchange id once however often it comes;
        returns how many exchanges were new. Raises the driver's errors."""
        ...

    async def close(self) -> None: ...


def writer_for(
    engine: AsyncEngine,
    busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS,
    pace: Callable[[float], float] = steady,
) -> Writer:
    """The writer for `engine`'s database: a SQLite file is written on its own connection, a
    PostgreSQL database through the engine's pool. `pace`: how long the SQLite writer's
    INSERTs run between two turns given to the relay (`turns.pace`); PostgreSQL's run on
    the server."""
    url = engine.url
    if url.get_backend_name() != "sqlite":
        return PgWriter(engine)
    if url.database in (None, "", ":memory:"):
        raise StoreError("records need a SQLite file, not a database in memory")
    return SqliteWriter(url.database, busy_timeout_ms, pace)
