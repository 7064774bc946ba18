"""Retention in the running proxy: prune at start, then every `EVERY` seconds.

Owned by the application's `cleanup_ctx` (`proxy.app.run`) when `retention_days` or
`retention_bodies_days` is set. Each run prunes whole exchanges older than `retention_days`,
then the bodies of those older than `retention_bodies_days`, in the small batches of
`proxy.store.prune` through its own engine. A run that fails (database down) or finds another
flightrec pruning (PostgreSQL's lock) logs one line and waits for the next: pruning never
stops the proxy. On shutdown the run in progress stops between two batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

from aiohttp import web

from .config import Config

log = logging.getLogger(__name__)

EVERY = 3600.0
"""Seconds between two runs."""
STOP_WAIT = 10.0
"""Seconds shutdown waits for the batch in progress before cancelling it."""


def cutoffs(config: Config, now: datetime) -> list[tuple[datetime, bool]]:
    """(before, bodies only) of each prune `config` asks for, whole exchanges first."""
    found = []
    if config.retention_days:
        found.append((now - timedelta(days=config.retention_days), False))
    if config.retention_bodies_days:
        found.append((now - timedelta(days=config.retention_bodies_days), True))
    return found


async def apply(config: Config, stop: asyncio.Event | None = None) -> None:
    """One run of the retention `config` sets; raises what the database raises."""
    from .store import create_engine
    from .store.prune import prune, pruning

    engine = create_engine(config.db_url)
    try:
        async with pruning(engine) as conn:
            for before, bodies in cutoffs(config, datetime.now(UTC)):
                began = time.monotonic()
                count = await prune(conn, before, bodies=bodies, stop=stop)
                what = "bodies of exchanges" if bodies else "exchanges"
                log.info(
                    "retention: pruned %d %s started before %s in %.1fs",
                    count,
                    what,
                    before.isoformat(timespec="seconds"),
                    time.monotonic() - began,
                )
    finally:
        await engine.dispose()


async def _loop(config: Config, stop: asyncio.Event, every: float) -> None:
    from .store.engine import describe
    from .store.prune import Busy

    while not stop.is_set():
        try:
            await apply(config, stop)
        except Busy as exc:
            log.info("retention: %s; next try in %.0fs", exc, every)
        except Exception as exc:  # the database's errors are many types; all wait a run
            log.warning("retention: prune failed (%s); next try in %.0fs", describe(exc), every)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)


def background(
    config: Config, every: float = EVERY
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A `cleanup_ctx` entry that runs retention while the application runs."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = asyncio.create_task(_loop(config, stop, every), name="flightrec-retention")
        yield
        stop.set()
        try:
            await asyncio.wait_for(task, STOP_WAIT)
        except TimeoutError:
            log.warning("retention: stopped in the middle of a batch (rolled back)")

    return context
