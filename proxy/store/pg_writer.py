"""The recorder's PostgreSQL writes: one transaction per batch, COPY for the rows.

A batch first asks which of its exchange ids are stored already; only the others are written
(COPY per table, parents first), then the fingerprint counts are upserted, all in the one
transaction. Statements go to asyncpg directly: SQLAlchemy's general execution path
processed every parameter in Python and compiled its statements anew for every batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from proxy.store import facets, threads
from proxy.store import tables as t
from proxy.store.batch_sql import book_pg, link_pg
from proxy.store.records import (
    columns,
    merged_fingerprints,
    not_stored,
    records,
    table_records,
    unique,
)
from proxy.store.rows import Rows

STORED_IDS = "SELECT id FROM exchanges WHERE id = ANY($1::varchar[])"
"""One array parameter, not an IN list rendered anew with a placeholder per id each batch."""

COUNT_FINGERPRINTS = """\
INSERT INTO fingerprints (upstream, model, system_fingerprint, first_seen, last_seen, count)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (upstream, model, system_fingerprint) DO UPDATE SET
    count = fingerprints.count + excluded.count,
    first_seen = least(fingerprints.first_seen, excluded.first_seen),
    last_seen = greatest(fingerprints.last_seen, excluded.last_seen)"""
"""Its columns are `tables.fingerprints`' in declared order, as `records` gives them."""
FACETS = facets.upsert_sql("postgresql")
TURNS = (
    "SELECT turn_key, id, session FROM exchanges WHERE turn_key = ANY($1::varchar[]) "
    "ORDER BY started_at"
)
"""The stored exchanges a batch's chat turns continue (`threads.link`), newest last."""


TAKES_LZ4 = (
    "SELECT coalesce(bool_or(enumvals @> ARRAY['lz4'] AND source = 'default'), false) "
    "FROM pg_settings WHERE name = 'default_toast_compression'"
)
"""Whether the writer asks for lz4: the server has it (PostgreSQL 14 and later, built with it)
and nobody chose a compression for it (the server's file, the database, the role)."""
LZ4 = "SET LOCAL default_toast_compression = lz4"


class PgWriter:
    """Writes batches of rows through `engine`'s pool.

    Values over ~2 KB (bodies, above all a response with logprobs) are compressed by the
    server as they are stored, with pglz unless a column or the session says otherwise. The
    writer's transactions ask for lz4 where the server has it and its operator chose nothing,
    which takes the server less time for somewhat more room (docs/performance.md). It asks
    the server once, and again after a write fails. What is stored already stays as it is;
    readers decompress either."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._lz4: bool | None = None

    async def write(self, batch: Sequence[Rows]) -> int:
        """Write a batch in one transaction; returns how many exchanges were new."""
        try:
            async with self.engine.begin() as conn:
                if self._lz4 is None:
                    self._lz4 = bool((await conn.exec_driver_sql(TAKES_LZ4)).scalar())
                if self._lz4:
                    await conn.exec_driver_sql(LZ4)
                return await write_in(conn, batch)
        except Exception:
            self._lz4 = None  # asked again: the server may be another one now (a failover)
            raise

    async def close(self) -> None:
        """Nothing of its own to close: the engine belongs to the caller."""


async def write_in(conn: AsyncConnection, batch: Sequence[Rows]) -> int:
    """Write a batch inside the transaction `conn` is in; returns how many were new."""
    by_id = unique(batch)
    if not by_id:
        return 0
    # Through SQLAlchemy's driver path, not asyncpg's: its first statement is what opens the
    # transaction that the raw COPYs and the upsert after it then run in.
    found = await conn.exec_driver_sql(STORED_IDS, (list(by_id),))
    fresh = not_stored(by_id, found.scalars())
    wanted = threads.wanted(fresh)
    turns: list[tuple[Any, ...]] = []
    if wanted:
        turns = [tuple(row) for row in await conn.exec_driver_sql(TURNS, (wanted,))]
    threads.link(fresh, {row[0]: (row[1], row[2]) for row in turns})
    driver = await _driver(conn)
    with _refused_as_value_error():
        fresh = await book_pg(driver, fresh)  # without batch results booked before
        for table, rows in table_records(fresh):
            # Only exchanges not yet stored get here (checked in this transaction; a process
            # writes its own exchanges one batch at a time), so no ON CONFLICT is needed.
            await driver.copy_records_to_table(table.name, records=rows, columns=columns(table))
        merged = merged_fingerprints([rows.fingerprint for rows in fresh if rows.fingerprint])
        if merged:
            await driver.executemany(COUNT_FINGERPRINTS, records(t.fingerprints, merged))
        summed = facets.of_batch(fresh)
        if summed:
            # The overview's sums, in this transaction: added once, for what was inserted.
            await driver.executemany(FACETS, facets.records(summed))
        await link_pg(driver, fresh)
    return len(fresh)


@contextmanager
def _refused_as_value_error() -> Iterator[None]:
    """asyncpg's errors about the data, not the database, as the ValueError the recorder
    takes for a record to set aside (SQLAlchemy wraps them in its own DataError otherwise)."""
    try:
        yield
    except (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError) as exc:
        raise ValueError(f"{type(exc).__name__}: {exc}") from exc


async def _driver(conn: AsyncConnection) -> asyncpg.Connection:
    """The asyncpg connection under `conn`, for statements of the transaction `conn` is in.

    asyncpg calls made before SQLAlchemy opened that transaction would each commit on their
    own, so that is checked here."""
    raw = await conn.get_raw_connection()
    driver: asyncpg.Connection = raw.driver_connection
    if not driver.is_in_transaction():
        raise RuntimeError("asyncpg used before the batch's transaction was opened")
    return driver
