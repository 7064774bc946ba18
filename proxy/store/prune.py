"""Retention: delete exchanges started before a time, or only their bodies.

Whole exchanges go oldest first, a small batch per transaction: the batch's usage and cost are
added to the daily rollups (`rollups.fold_query`, `rollups.save`) in the transaction that
deletes it, so a cost report sees each exchange exactly once at every moment. Only what the
DELETE says it removed is folded (RETURNING), so two pruners racing over the same rows never
count one twice. Children are deleted explicitly, not left to `ON DELETE CASCADE`, which
SQLite applies only on connections that turned foreign keys on. On a PostgreSQL database
partitioned by day (migration 0010), each whole day due is folded and dropped at once first
(`partitions`); the batches then take what is left.

Short transactions keep SQLite's write lock free for the recorder's writer: the batch is
chosen and read before the first DELETE takes the lock, the transaction runs in one call on a
thread of its own (`Pruner`), and after each batch the pruner waits at least three times as
long as the batch took. On PostgreSQL deletes take row locks only, which inserts never wait
for; one session-level advisory lock (`PRUNE_LOCK`) lets one flightrec prune at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from proxy.store import partitions, rollups
from proxy.store import tables as t
from proxy.store.engine import SQLITE_BUSY_TIMEOUT_MS as BUSY_MS
from proxy.store.engine import sqlite_pragmas

T = TypeVar("T")

BATCH = {"sqlite": 200, "postgresql": 500}
"""Exchanges per transaction: on SQLite as many as keep the write lock short; PostgreSQL's
deletes block no insert, and larger batches cost less per exchange."""
PAUSE = 0.05
"""Least seconds between two batches."""
SHARE = 3
"""Between batches the pruner waits at least this many times as long as the batch took."""
PRUNE_LOCK = 0x666C_6967_6874_7072
"""The PostgreSQL advisory lock key held while pruning ("flightpr")."""
CHILDREN = (t.tags, t.completions, t.choices, t.usage, t.logprobs, t.raw_streams)
BODY_ROWS = (t.choices, t.logprobs, t.raw_streams)
"""Rows that hold bodies: they go with the bodies."""
BODIES = ("request", "request_body", "response", "response_body")


class Busy(Exception):
    """Another flightrec holds the prune lock (PostgreSQL)."""


@dataclass(slots=True)
class Pruned:
    """What a prune did."""

    count: int = 0
    """Exchanges pruned (or stripped of their bodies)."""
    longest: float = 0.0
    """Seconds the longest batch took, its transaction and the reads before it."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What a prune would do (`--dry-run`)."""

    exchanges: int
    oldest: datetime | None


class Pruner:
    """Runs one function of a sync `Connection` per transaction: on SQLite in one call on a
    thread of its own, so the transaction never waits for the event loop between statements
    (a busy loop stretched each one, and the write lock with it); on PostgreSQL on the loop,
    through the async connection (`run_sync`)."""

    def __init__(self, sync: sa.Connection | None, aconn: AsyncConnection | None) -> None:
        self._sync, self._async = sync, aconn
        self.batch = BATCH["sqlite" if sync is not None else "postgresql"]

    async def run(self, work: Callable[[sa.Connection], T]) -> T:
        if self._sync is not None:
            return await asyncio.to_thread(self._in_transaction, self._sync, work)
        assert self._async is not None
        async with self._async.begin():
            return await self._async.run_sync(work)

    @staticmethod
    def _in_transaction(conn: sa.Connection, work: Callable[[sa.Connection], T]) -> T:
        with conn.begin():
            return work(conn)


@contextlib.asynccontextmanager
async def pruning(engine: AsyncEngine, *, exclusive: bool = True) -> AsyncIterator[Pruner]:
    """A `Pruner` on `engine`'s database; on PostgreSQL, unless not `exclusive`, it holds
    `PRUNE_LOCK` (or raises `Busy`).

    Session-level, not per transaction: one flightrec runs a whole prune while the others
    skip theirs, instead of interleaving batches; if the process dies, the server ends the
    session and the lock with it.
    """
    if engine.dialect.name == "sqlite":
        sync = sa.create_engine(
            engine.url.set(drivername="sqlite"),
            poolclass=sa.NullPool,
            connect_args={"check_same_thread": False},  # one thread at a time, in turn
        )
        event.listen(sync, "connect", lambda con, _: sqlite_pragmas(con, busy_timeout_ms=BUSY_MS))
        conn = await asyncio.to_thread(sync.connect)
        try:
            yield Pruner(conn, None)
        finally:
            await asyncio.to_thread(conn.close)
            sync.dispose()
        return
    async with engine.connect() as aconn:
        locking = exclusive
        if locking:
            got = await aconn.scalar(sa.select(sa.func.pg_try_advisory_lock(PRUNE_LOCK)))
            await aconn.commit()
            if not got:
                raise Busy("another flightrec is pruning this database")
        try:
            yield Pruner(None, aconn)
        finally:
            if locking and not aconn.closed and not aconn.invalidated:
                await aconn.rollback()
                await aconn.execute(sa.select(sa.func.pg_advisory_unlock(PRUNE_LOCK)))
                await aconn.commit()


def _has_bodies() -> sa.ColumnElement[bool]:
    return sa.or_(*(t.exchanges.c[name].is_not(None) for name in BODIES))


def _before(before: datetime, bodies: bool) -> list[sa.ColumnElement[bool]]:
    found = [t.exchanges.c.started_at < before]
    return [*found, _has_bodies()] if bodies else found


async def by_whole_days(pruner: Pruner) -> bool:
    """Whether the database prunes whole days at once (partitioned PostgreSQL)."""
    return bool(await pruner.run(partitions.is_partitioned))


async def plan(pruner: Pruner, before: datetime, *, bodies: bool = False) -> Plan:
    """How many exchanges (with bodies, for `bodies`) started before `before`."""
    ex = t.exchanges
    query = sa.select(sa.func.count(), sa.func.min(ex.c.started_at)).where(*_before(before, bodies))
    count, oldest = await pruner.run(lambda conn: conn.execute(query).one())
    return Plan(int(count), oldest)


async def prune(
    pruner: Pruner,
    before: datetime,
    *,
    bodies: bool = False,
    batch: int | None = None,
    pause: float = PAUSE,
    stop: asyncio.Event | None = None,
) -> Pruned:
    """Delete exchanges started before `before` (or, for `bodies`, only their bodies),
    oldest first, `batch` at a time (default: `BATCH`). Stops early, between batches, once
    `stop` is set."""
    done = Pruned()
    if not bodies:
        await _drop_days(pruner, before, done, pause, stop)
    after: list[Any] = []
    size = batch or pruner.batch
    while stop is None or not stop.is_set():
        began = time.monotonic()
        count = await pruner.run(lambda conn: _batch(conn, before, bodies, size, after))
        took = time.monotonic() - began
        if count is None:
            break
        done.count += count
        done.longest = max(done.longest, took)
        await asyncio.sleep(max(pause, SHARE * took))
    return done


async def _drop_days(
    pruner: Pruner, before: datetime, done: Pruned, pause: float, stop: asyncio.Event | None
) -> None:
    """On a partitioned PostgreSQL database, every whole day due goes at once, a transaction
    each (`partitions.drop_day`); the batches then prune what no dropped day held."""
    due = await pruner.run(
        lambda conn: partitions.due_days(conn, before) if partitions.is_partitioned(conn) else []
    )
    took = 0.0
    for n, day in enumerate(due):
        if n:  # between two days, as between two batches
            await asyncio.sleep(max(pause, SHARE * took))
        if stop is not None and stop.is_set():
            return
        began = time.monotonic()
        done.count += await pruner.run(partial(partitions.drop_day, day=day))
        took = time.monotonic() - began
        done.longest = max(done.longest, took)


def _batch(
    conn: sa.Connection, before: datetime, bodies: bool, size: int, after: list[Any]
) -> int | None:
    """Prune the oldest `size` exchanges due; None when none is left. `after` holds the last
    (started_at, id) stripped: bodies-only pruning walks on past the rows it keeps."""
    ex = t.exchanges
    query = sa.select(ex.c.started_at, ex.c.id).where(*_before(before, bodies))
    if after:
        query = query.where(sa.tuple_(ex.c.started_at, ex.c.id) > tuple(after))
    found = conn.execute(query.order_by(ex.c.started_at, ex.c.id).limit(size)).all()
    if not found:
        return None
    ids = [row.id for row in found]
    if bodies:
        after[:] = found[-1]
        return _strip(conn, ids)
    return _delete(conn, ids)


def _delete(conn: sa.Connection, ids: Sequence[str]) -> int:
    """Fold, then delete, the exchanges `ids` that are still there."""
    ex, tags = t.exchanges, t.tags
    found = conn.execute(rollups.fold_query(ids)).all()
    tagged: dict[str, list[tuple[str, str]]] = {id_: [] for id_ in ids}
    for row in conn.execute(sa.select(tags).where(tags.c.exchange_id.in_(ids))):
        tagged[row.exchange_id].append((row.key, row.value))
    summed = rollups.add(found, tagged)  # before the lock: it is held for writing alone
    for table in CHILDREN:  # the first write: SQLite's lock is taken here, not before
        conn.execute(sa.delete(table).where(table.c.exchange_id.in_(ids)))
    gone = set(conn.execute(sa.delete(ex).where(ex.c.id.in_(ids)).returning(ex.c.id)).scalars())
    if len(gone) < len(found):  # another pruner took some first: fold only what went here
        summed = rollups.add((row for row in found if row.id in gone), tagged)
    rollups.save(conn, summed)
    return len(gone)


def _strip(conn: sa.Connection, ids: Sequence[str]) -> int:
    """Drop the bodies of `ids`: they read as omitted; usage, cost and tags stay."""
    ex = t.exchanges
    values: dict[str, Any] = dict.fromkeys(BODIES)
    values |= {"request_omitted": True, "response_omitted": True}
    result = conn.execute(sa.update(ex).where(ex.c.id.in_(ids)).values(values))
    for table in BODY_ROWS:
        conn.execute(sa.delete(table).where(table.c.exchange_id.in_(ids)))
    return int(result.rowcount)
