"""The recorder's SQLite writes, made on the event loop's thread a few rows at a time.

With aiosqlite every statement runs on a worker thread, and under load the relay's thread and
that worker traded the GIL for every statement and every bound row, which cost more CPU than
SQLite's own work (docs/performance.md). So this writer does the work on the loop's thread in
small INSERTs and gives the relay a turn (`turns.Turns`) between them: a stretch of at most
`turns.MAX_BUDGET`, or `turns.MAX_STRETCH` for a writer far behind.

Nothing here may hold the loop for long:
- COMMIT, which writes the batch to the log, runs on a worker thread (one hop per batch);
- the connection never waits for a lock (busy timeout 0): a busy `BEGIN IMMEDIATE` (another
  process writing) is retried after short asyncio sleeps, up to the busy timeout, and then
  raised as the database being unavailable, which sends the batch to the spool;
- WAL checkpoints, which copy the log into the database file and fsync it, are off on this
  connection; one runs at most once a second on a worker thread with its own connection.
  Beside a writer that never pauses it cannot copy the whole log, and the log grows: past
  `WAL_CATCH_UP_BYTES` the writer waits for one between two batches.
  A checkpoint that fails (the file made read-only under the proxy) or a log that keeps
  growing is a warning at once, then at most once a minute: the log grows with every write
  until checkpoints work again.

A batch is idempotent by exchange id: only exchanges not stored yet are inserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from functools import cache
from typing import Any

import sqlalchemy as sa

from proxy.store import facets, threads
from proxy.store import tables as t
from proxy.store.batch_sql import book_sqlite, link_sqlite
from proxy.store.engine import create_private, describe, sqlite_pragmas
from proxy.store.logprob_rows import Record
from proxy.store.records import (
    columns,
    in_lists,
    merged_fingerprints,
    not_stored,
    records,
    table_records,
    unique,
)
from proxy.store.rows import Rows
from proxy.store.turns import Turns, steady
from proxy.store.wal import WalWatch, checkpoint, log_size

log = logging.getLogger(__name__)

CHUNK_ROWS = 64
"""Rows of a child table per INSERT; the writer may give the relay a turn after each."""
FAT_CHUNK_ROWS = {"exchanges": 16, "raw_streams": 16}
"""Tables whose rows carry whole bodies: fewer per INSERT, so one holds the loop briefly;
fewer still costs CPU per request (docs/performance.md)."""
COUNT_FINGERPRINTS = """\
INSERT INTO fingerprints (upstream, model, system_fingerprint, first_seen, last_seen, count)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (upstream, model, system_fingerprint) DO UPDATE SET
    count = count + excluded.count,
    first_seen = min(first_seen, excluded.first_seen),
    last_seen = max(last_seen, excluded.last_seen)"""
"""Columns in `tables.fingerprints` order; times are text that sorts as time, so min/max work."""
CHECKPOINT_EVERY = 1.0
"""Seconds between WAL checkpoints while records are being written."""
WAL_LIMIT_BYTES = 64 * 1024 * 1024
"""A log grown past this (a reader kept it from restarting) is cut back to it at its next
restart (`journal_size_limit`), so its size on disk says how it is doing now."""
WAL_CATCH_UP_BYTES = 128 * 1024 * 1024
"""A log past this size after a batch is checkpointed before the next batch, while nothing is
written, so that it starts again (`_catch_up`). Above `WAL_LIMIT_BYTES`, the size a log
that started again is cut back to."""
CATCH_UP_WAIT = 1.0
"""Seconds the writer waits for such a checkpoint at most (less than the recorder's
`STALLED_AFTER`); a longer one goes on beside the writes."""
_BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
_FACETS = facets.upsert_sql("sqlite")


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _BUSY
    return "locked" in str(exc)


class SqliteWriter:
    """Writes batches of rows to one SQLite file; use from the event loop's thread only."""

    def __init__(
        self, path: str, busy_timeout_ms: int, pace: Callable[[float], float] = steady
    ) -> None:
        """`pace`: the seconds of work between two turns given to the relay, asked at each
        turn with the seconds the relay's turn took (`turns.pace`)."""
        self.path = path
        self._pace = pace
        self._busy_timeout = busy_timeout_ms / 1000
        self._con: sqlite3.Connection | None = None
        self._checkpointing: asyncio.Task[bool] | None = None
        self._catch_up_after = -math.inf
        self._last_checkpoint = 0.0
        self._wal = WalWatch(path)

    def _connection(self) -> sqlite3.Connection:
        if self._con is None:
            create_private(self.path)
            # Used from the loop's thread, and by `_commit` from a worker thread, never both.
            con = sqlite3.connect(
                self.path, timeout=0.0, isolation_level=None, check_same_thread=False
            )
            try:
                sqlite_pragmas(con, busy_timeout_ms=0)
                # Children are inserted only with their exchange, in its transaction: the
                # check of each child row's key (a lookup in `exchanges`, a hundred for an
                # exchange with logprobs) cannot fail here. Every other connection keeps it,
                # and deletes cascade there (`store.prune`).
                con.execute("PRAGMA foreign_keys = OFF")
                con.execute("PRAGMA wal_autocheckpoint = 0")
                con.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
            except BaseException:
                con.close()
                raise
            self._con = con
        return self._con

    async def write(self, batch: Sequence[Rows]) -> int:
        """Write a batch in one transaction; returns how many exchanges were new.

        Raises sqlite3 errors as they come (the recorder tells an outage from a refused
        record); a failed transaction is rolled back and, unless the database was only busy,
        the connection is dropped so the next write starts afresh.
        """
        by_id = unique(batch)
        if not by_id:
            return 0
        con = self._connection()
        await self._begin(con)
        try:
            fresh = not_stored(by_id, _stored_ids(con, list(by_id)))
            threads.link(fresh, _turns(con, threads.wanted(fresh)))
            fresh = book_sqlite(con, fresh)  # without batch results booked before
            turns = Turns(self._pace)
            for table, found in table_records(fresh):
                size = FAT_CHUNK_ROWS.get(table.name, CHUNK_ROWS)
                for start, stop in spans(len(found), size):
                    await turns.give()
                    _insert(con, table, found[start:stop])
            fingerprints = merged_fingerprints([r.fingerprint for r in fresh if r.fingerprint])
            if fingerprints:
                merged = records(t.fingerprints, fingerprints)
                con.executemany(COUNT_FINGERPRINTS, _sqlite_records(t.fingerprints, merged))
            summed = facets.of_batch(fresh)
            if summed:
                con.executemany(_FACETS, facets.records(summed, sqlite_time))
            link_sqlite(con, fresh)
            await self._commit(con)
        except BaseException as exc:
            self._abandon(con, exc)
            raise
        now = asyncio.get_running_loop().time()
        if log_size(self.path) > WAL_CATCH_UP_BYTES and now >= self._catch_up_after:
            await self._catch_up(now)
        else:
            self._maybe_checkpoint()
        return len(fresh)

    @staticmethod
    async def _commit(con: sqlite3.Connection) -> None:
        """COMMIT on a worker thread: it writes the whole batch to the log (about a millisecond
        for a hundred records), longer than the relay should wait, in one call that releases
        the GIL. Once started it is seen through even if the writer is cancelled, so the
        connection is never used from two threads at once."""
        done = asyncio.ensure_future(asyncio.to_thread(con.execute, "COMMIT"))
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await done
            raise

    async def _begin(self, con: sqlite3.Connection) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._busy_timeout
        pause = 0.001
        while True:
            try:
                con.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or loop.time() >= deadline:
                    self._abandon(con, exc)
                    raise
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)

    def _abandon(self, con: sqlite3.Connection, exc: BaseException) -> None:
        if con.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                con.execute("ROLLBACK")
        broken = isinstance(exc, sqlite3.OperationalError) and not _is_busy(exc)
        if broken or type(exc) is sqlite3.DatabaseError:
            # Disk full, file gone, I/O error: reopen on the next try rather than trust it.
            self._drop()

    def _drop(self) -> None:
        if self._con is not None:
            with contextlib.suppress(sqlite3.Error):
                self._con.close()
            self._con = None

    def _maybe_checkpoint(self) -> None:
        now = asyncio.get_running_loop().time()
        if self._checkpointing is not None or now - self._last_checkpoint < CHECKPOINT_EVERY:
            return
        self._last_checkpoint = now
        self._checkpointing = asyncio.create_task(self._run_checkpoint())

    async def _catch_up(self, now: float) -> None:
        """A checkpoint while nothing is written, so it copies the whole log and the next
        transaction starts the log again from its beginning. One running beside the writes
        never catches up with a writer that is always busy, and the log then grows by every
        batch for as long as the load lasts. Waited for `CATCH_UP_WAIT` at most, never
        cancelled; when it cannot copy the whole log (a reader holds it, checkpoints fail, the
        disk is slow) the writer goes back to one a second for `CHECKPOINT_EVERY`."""
        deadline = now + CATCH_UP_WAIT
        loop = asyncio.get_running_loop()
        if self._checkpointing is not None:  # begun beside the last batch: not all of it
            await asyncio.wait({self._checkpointing}, timeout=CATCH_UP_WAIT)
        whole = False
        if self._checkpointing is None:
            self._last_checkpoint = loop.time()
            task = self._checkpointing = asyncio.create_task(self._run_checkpoint())
            await asyncio.wait({task}, timeout=max(deadline - loop.time(), 0.0))
            whole = task.done() and task.result()
        if not whole:
            self._catch_up_after = loop.time() + CHECKPOINT_EVERY

    async def _run_checkpoint(self) -> bool:
        error, whole = None, False
        try:
            whole = await asyncio.to_thread(checkpoint, self.path)
        except (sqlite3.Error, OSError) as exc:  # the records are in the log all the same
            error = describe(exc)
        finally:
            self._checkpointing = None
        self._wal.checked(asyncio.get_running_loop().time(), error)
        return whole

    async def close(self) -> None:
        if self._checkpointing is not None:
            with contextlib.suppress(Exception):
                await self._checkpointing
        self._drop()


def _stored_ids(con: sqlite3.Connection, ids: list[str]) -> list[str]:
    """Which of `ids` the database holds."""
    stored: list[str] = []
    for marks, part in in_lists(ids):
        found = con.execute(f"SELECT id FROM exchanges WHERE id IN ({marks})", part)
        stored.extend(row[0] for row in found)
    return stored


def _turns(con: sqlite3.Connection, wanted: list[str]) -> dict[str, tuple[str, str | None]]:
    """The newest stored exchange (id, session) for each turn key in `wanted`."""
    found: dict[str, tuple[str, str | None]] = {}
    for marks, part in in_lists(wanted):
        rows = con.execute(
            "SELECT turn_key, id, session FROM exchanges WHERE turn_key IN "
            f"({marks}) ORDER BY started_at",
            part,
        )
        found.update((key, (exchange_id, session)) for key, exchange_id, session in rows)
    return found


def spans(count: int, size: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of each INSERT of `count` rows: `size` rows at a time, then what is left
    in powers of two, largest first. So each table has a few statement texts, which sqlite3's
    statement cache (128 texts) keeps prepared; a last INSERT of any length would need a text
    of its own in most batches, and preparing one costs far more than running it
    (docs/performance.md, *The writer's statements, prepared once*)."""
    start = 0
    while start < count:
        left = count - start
        step = size if left >= size else 1 << (left.bit_length() - 1)
        yield start, start + step
        start += step


def _insert(con: sqlite3.Connection, table: sa.Table, found: list[Record]) -> None:
    """One multi-row INSERT (its text cached by size and prepared once: `spans`), not
    `executemany`: sqlite3 resets the statement and gives up the GIL around every step, a
    step per row, and that cost more CPU a row (docs/performance.md).

    `OR FAIL`: a refused row ends the statement and keeps the rows before it, where the
    default (`ABORT`) undoes them, for which SQLite copies every page the statement changes
    into a statement journal, a temporary file past 64 KiB. Nothing needs that undo: a failed
    INSERT fails the batch, and its whole transaction is rolled back (`_abandon`)."""
    con.execute(_insert_sql(table, len(found)), _insert_values(table, found))


def _insert_values(table: sa.Table, found: list[Record]) -> list[Any]:
    """`found` flattened for one INSERT, with what Python 3.11's sqlite3 binds slowly
    replaced by what it binds fast and SQLite stores the same: None by `SQLITE_NULL`, times by
    SQLAlchemy's SQLite DateTime text, booleans by 0 and 1. sqlite3 looks for an adapter for
    any value that is not exactly str, int, float or bytes, and for None and bool that costs an
    AttributeError raised and cleared (docs/performance.md, *How records get there*)."""
    null = sqlite_null()
    values = [null if v is None else v for record in found for v in record]
    width = len(table.columns)
    for i, to_sqlite in _converters(table):
        for at in range(i, len(values), width):
            if values[at] is not null:
                values[at] = to_sqlite(values[at])
    return values


SQLITE_NULL = float("nan")
"""Bound for NULL: SQLite stores a NaN bound as a REAL as NULL (sqlite3_bind_double);
`sqlite_null` checks that the library here does."""


@cache
def sqlite_null() -> float | None:
    """`SQLITE_NULL` if the SQLite library here stores it as NULL, else None (NULL everywhere,
    only slower to bind)."""
    with contextlib.closing(sqlite3.connect(":memory:")) as con:
        stored_null = con.execute("SELECT ? IS NULL", (SQLITE_NULL,)).fetchone()[0]
    return SQLITE_NULL if stored_null else None


@cache
def _insert_sql(table: sa.Table, count: int) -> str:
    names = ", ".join(f'"{name}"' for name in columns(table))
    row = "(" + ", ".join("?" * len(table.columns)) + ")"
    return f'INSERT OR FAIL INTO "{table.name}" ({names}) VALUES ' + ", ".join([row] * count)


def _sqlite_records(table: sa.Table, found: list[Record]) -> list[tuple[Any, ...]]:
    """`_insert_values` as one tuple per row, for `executemany`."""
    values, width = _insert_values(table, found), len(table.columns)
    return [tuple(values[at : at + width]) for at in range(0, len(values), width)]


@cache
def _converters(table: sa.Table) -> list[tuple[int, Callable[[Any], Any]]]:
    return [
        (i, sqlite_time if isinstance(c.type, sa.DateTime) else int)
        for i, c in enumerate(table.columns)
        if isinstance(c.type, sa.DateTime | sa.Boolean)
    ]


def sqlite_time(value: datetime) -> str:
    """A time as SQLAlchemy's SQLite DateTime stores it (UTC wall clock, always with
    microseconds: "2024-05-01 12:00:00.000000"), so reads parse it back. Formatted from its
    fields: `isoformat` parses its arguments and formats the UTC offset only to be cut off,
    and every exchange's start goes through here."""
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    return _TIME % (
        value.year,
        value.month,
        value.day,
        value.hour,
        value.minute,
        value.second,
        value.microsecond,
    )


_TIME = "%04d-%02d-%02d %02d:%02d:%02d.%06d"
