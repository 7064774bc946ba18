"""`serve` on a partitioned PostgreSQL database: the days ahead get their partitions.

At start and every `partitions.EVERY` seconds after, each worker creates the partitions of
today and the `partitions.AHEAD_DAYS` after it that are missing (two workers racing for one
leave it to the next run), so records always land in their day's partition and retention can
drop whole days. A run that fails (the database down) logs one line and waits for the next:
records of a day without partitions go to the DEFAULT partition meanwhile, and are pruned in
batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import sqlalchemy as sa
from aiohttp import web

from proxy.config import Config
from proxy.store import partitions
from proxy.store.engine import create_engine, describe

log = logging.getLogger(__name__)


def _ahead(conn: sa.Connection) -> list[str]:
    if not partitions.is_partitioned(conn):
        return []
    created = partitions.create_days(conn, partitions.ahead(datetime.now(UTC).date()))
    return [day.isoformat() for day in created]


async def keep_ahead_once(url: str) -> list[str]:
    """Create the missing partitions ahead; the days created."""
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            return await conn.run_sync(_ahead)
    finally:
        await engine.dispose()


async def _loop(url: str, every: float) -> None:
    while True:
        try:
            created = await keep_ahead_once(url)
        except Exception as exc:  # the database is down: the next run tries again
            reason = describe(exc)
            log.warning("partitions ahead not created (%s); next try in %.0fs", reason, every)
        else:
            if created:
                log.info("partitions created for %s", ", ".join(created))
        await asyncio.sleep(every)


def keep_ahead(
    config: Config, every: float = partitions.EVERY
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A `cleanup_ctx` entry that keeps partitions ahead while the application runs."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(_loop(config.db_url, every), name="flightrec-partitions")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return context
