"""Retention: delete exchanges started before a time, or only their bodies.

Whole exchanges go oldest first, a small batch per transaction: the batch's usage and cost are
added to the daily rollups (`rollups.fold_query`, `rollups.save`) in the transaction that
deletes it, so a cost report sees each exchange exactly once at every moment. Only what the
DELETE says it removed is folded (RETURNING), so two pruners racing over the same rows never
count one twice. Children are deleted explicitly, not left to `ON DELETE CASCADE`, which
SQLite applies only on connections that turned foreign keys on.

Short transactions keep SQLite's write lock free for the recorder's writer: the batch is
chosen and read before the first DELETE takes the lock, and after each batch the pruner waits
at least three times as long as the batch took. On PostgreSQL deletes take row locks only,
which inserts never wait for; one session-level advisory lock (`PRUNE_LOCK`) lets one
flightrec prune at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from . import rollups
from . import tables as t

BATCH = 200
"""Exchanges per transaction."""
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


@dataclass(frozen=True, slots=True)
class Plan:
    """What a prune would do (`--dry-run`)."""

    exchanges: int
    oldest: datetime | None


@contextlib.asynccontextmanager
async def pruning(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection to prune through; on PostgreSQL it holds `PRUNE_LOCK` (else `Busy`).

    Session-level, not per transaction: one flightrec runs a whole prune while the others
    skip theirs, instead of interleaving batches; if the process dies, the server ends the
    session and the lock with it.
    """
    async with engine.connect() as conn:
        locking = conn.dialect.name == "postgresql"
        if locking:
            got = await conn.scalar(sa.select(sa.func.pg_try_advisory_lock(PRUNE_LOCK)))
            await conn.commit()
            if not got:
                raise Busy("another flightrec is pruning this database")
        try:
            yield conn
        finally:
            if locking and not conn.closed and not conn.invalidated:
                await conn.rollback()
                await conn.execute(sa.select(sa.func.pg_advisory_unlock(PRUNE_LOCK)))
                await conn.commit()


def _has_bodies() -> sa.ColumnElement[bool]:
    return sa.or_(*(t.exchanges.c[name].is_not(None) for name in BODIES))


def _before(before: datetime, bodies: bool) -> list[sa.ColumnElement[bool]]:
    found = [t.exchanges.c.started_at < before]
    return [*found, _has_bodies()] if bodies else found


async def plan(conn: AsyncConnection, before: datetime, *, bodies: bool = False) -> Plan:
    """How many exchanges (with bodies, for `bodies`) started before `before`."""
    ex = t.exchanges
    query = sa.select(sa.func.count(), sa.func.min(ex.c.started_at)).where(*_before(before, bodies))
    count, oldest = (await conn.execute(query)).one()
    await conn.commit()
    return Plan(int(count), oldest)


async def prune(
    conn: AsyncConnection,
    before: datetime,
    *,
    bodies: bool = False,
    batch: int = BATCH,
    pause: float = PAUSE,
    stop: asyncio.Event | None = None,
) -> int:
    """Delete exchanges started before `before` (or, for `bodies`, only their bodies),
    oldest first; returns how many. Stops early, between batches, once `stop` is set."""
    ex = t.exchanges
    done = 0
    after: tuple[Any, str] | None = None
    while stop is None or not stop.is_set():
        began = time.monotonic()
        async with conn.begin():
            query = sa.select(ex.c.started_at, ex.c.id).where(*_before(before, bodies))
            if after is not None:  # bodies: the stripped rows stay, so walk on past them
                query = query.where(sa.tuple_(ex.c.started_at, ex.c.id) > after)
            found = (
                await conn.execute(query.order_by(ex.c.started_at, ex.c.id).limit(batch))
            ).all()
            if not found:
                return done
            ids = [row.id for row in found]
            after = (found[-1].started_at, found[-1].id)
            done += await (_strip(conn, ids) if bodies else _delete(conn, ids))
        await asyncio.sleep(max(pause, SHARE * (time.monotonic() - began)))
    return done


async def _delete(conn: AsyncConnection, ids: Sequence[str]) -> int:
    """Fold, then delete, the exchanges `ids` that are still there."""
    ex, tags = t.exchanges, t.tags
    found = (await conn.execute(rollups.fold_query(ids))).all()
    tagged: dict[str, list[tuple[str, str]]] = {id_: [] for id_ in ids}
    for row in await conn.execute(sa.select(tags).where(tags.c.exchange_id.in_(ids))):
        tagged[row.exchange_id].append((row.key, row.value))
    summed = rollups.add(found, tagged)  # before the lock: it is held for writing alone
    for table in CHILDREN:  # the first write: SQLite's lock is taken here, not before
        await conn.execute(sa.delete(table).where(table.c.exchange_id.in_(ids)))
    deleted = sa.delete(ex).where(ex.c.id.in_(ids)).returning(ex.c.id)
    gone = set((await conn.execute(deleted)).scalars())
    if len(gone) < len(found):  # another pruner took some first: fold only what went here
        summed = rollups.add((row for row in found if row.id in gone), tagged)
    await rollups.save(conn, summed)
    return len(gone)


async def _strip(conn: AsyncConnection, ids: Sequence[str]) -> int:
    """Drop the bodies of `ids`: they read as omitted; usage, cost and tags stay."""
    ex = t.exchanges
    values: dict[str, Any] = dict.fromkeys(BODIES)
    values |= {"request_omitted": True, "response_omitted": True}
    result = await conn.execute(sa.update(ex).where(ex.c.id.in_(ids)).values(values))
    for table in BODY_ROWS:
        await conn.execute(sa.delete(table).where(table.c.exchange_id.in_(ids)))
    return int(result.rowcount)
