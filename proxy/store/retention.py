"""Retention in the running proxy: prune at start, then every `EVERY` seconds.

Owned by the application's `cleanup_ctx` (`proxy.serve.run`) when `retention_days` or
`retention_bodies_days` is set. Each run happens in a process of its own, so its work never
competes with the relay for the proxy's event loop or its GIL (a thread in the proxy held
SQLite's write lock for as long as it waited for the GIL); a run prunes whole exchanges older
than `retention_days`, then the bodies of those older than `retention_bodies_days`, in the
small batches of `proxy.store.prune`. A run that fails (database down), finds another flightrec
pruning (PostgreSQL's lock) or dies logs one line and the next one comes `EVERY` seconds
later: pruning never stops the proxy. On shutdown the run stops between two batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta

from aiohttp import web

from proxy.config import Config

log = logging.getLogger(__name__)

EVERY = 3600.0
"""Seconds between two runs."""
NICE = 10
"""Added to the niceness of a run on PostgreSQL."""
STOP_WAIT = 10.0
"""Seconds shutdown waits for the batch in progress before killing the run."""


def cutoffs(
    config: Config, now: datetime, *, whole_days: bool = False
) -> list[tuple[datetime, bool]]:
    """(before, bodies only) of each prune `config` asks for, whole exchanges first.

    `whole_days` (a partitioned PostgreSQL database): whole exchanges are cut at the UTC
    midnight on or before `retention_days` ago, so each day goes as one dropped partition
    when it is wholly due; cut to the second, the day holding the cut would be deleted an
    hour's exchanges at a time, row by row, and its partitions would be found empty. An
    exchange is then kept between `retention_days` and one day more."""
    found = []
    if config.retention_days:
        before = now - timedelta(days=config.retention_days)
        if whole_days:
            before = before.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        found.append((before, False))
    if config.retention_bodies_days:
        found.append((now - timedelta(days=config.retention_bodies_days), True))
    return found


def exchanges(count: int) -> str:
    """`1 exchange`, `2 exchanges`: what the prune lines count."""
    return f"{count} exchange" if count == 1 else f"{count} exchanges"


async def apply(config: Config, stop: asyncio.Event | None = None) -> None:
    """One run of the retention `config` sets; raises what the database raises."""
    from proxy.store import create_engine
    from proxy.store.prune import by_whole_days, prune, pruning

    engine = create_engine(config.db_url)
    try:
        async with pruning(engine) as pruner:
            whole_days = await by_whole_days(pruner)
            for before, bodies in cutoffs(config, datetime.now(UTC), whole_days=whole_days):
                began = time.monotonic()
                done = await prune(pruner, before, bodies=bodies, stop=stop)
                log.info(
                    "retention: pruned %s%s started before %s in %.1fs (longest batch %.0f ms)",
                    "the bodies of " if bodies else "",
                    exchanges(done.count),
                    before.isoformat(timespec="seconds"),
                    time.monotonic() - began,
                    done.longest * 1000,
                )
    finally:
        await engine.dispose()


def _run(config: Config) -> None:
    """A run in its own process: stops between batches on SIGTERM/SIGINT or when the proxy
    that started it is gone."""
    from proxy.logs import log_to_stderr

    log_to_stderr(config.log_level)
    if not config.db_url.startswith("sqlite"):
        # The relay comes first for the CPU. Not on SQLite, where a run preempted while it
        # holds the write lock would keep the recorder waiting.
        os.nice(NICE)
    asyncio.run(_run_here(config, os.getppid()))


async def _run_here(config: Config, parent: int) -> None:
    from proxy.store.engine import describe
    from proxy.store.prune import Busy

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watch = asyncio.create_task(_orphaned(parent, stop))
    try:
        await apply(config, stop)
    except Busy as exc:
        log.info("retention: %s; next try in %.0fs", exc, EVERY)
    except Exception as exc:  # the database's errors are many types; all wait a run
        log.warning("retention: prune failed (%s); next try in %.0fs", describe(exc), EVERY)
    finally:
        watch.cancel()


async def _orphaned(parent: int, stop: asyncio.Event) -> None:
    while os.getppid() == parent and not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1)
    stop.set()


async def _loop(config: Config, stop: asyncio.Event, every: float) -> None:
    while not stop.is_set():
        try:
            await _one_run(config, stop, every)
        except Exception as exc:  # cannot start a process (out of memory, limits): next time
            log.warning("retention: could not run (%s); next try in %.0fs", exc, every)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)


async def _one_run(config: Config, stop: asyncio.Event, every: float) -> None:
    context = multiprocessing.get_context("spawn")  # never fork a process running threads
    run = context.Process(target=_run, args=(config,), name="flightrec-retention")
    run.daemon = True  # killed if the proxy exits without stopping it
    run.start()
    while run.is_alive() and not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    if not run.is_alive():
        if run.exitcode != 0:
            log.warning(
                "retention: the run died (exit code %s); next in %.0fs", run.exitcode, every
            )
        return
    run.terminate()  # shutting down. SIGTERM: the run stops after the batch in progress
    await asyncio.to_thread(run.join, STOP_WAIT)
    if run.is_alive():
        log.warning("retention: stopped in the middle of a batch (rolled back)")
        run.kill()
        await asyncio.to_thread(run.join)


def background(
    config: Config, every: float = EVERY
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A `cleanup_ctx` entry that runs retention while the application runs."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = asyncio.create_task(_loop(config, stop, every), name="flightrec-retention")
        yield
        stop.set()
        await task

    return context
