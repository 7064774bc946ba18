"""What every console handler reads: the database, the token, the templates, the config."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import jinja2
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.config import Config
from proxy.keynames import KeyNames
from proxy.sinks.metrics import MetricsSink
from proxy.store import overview

log = logging.getLogger(__name__)
FOLD_RETRY = 300.0
"""Seconds before folded rows are written again after the database refused them."""


@dataclass(slots=True)
class Console:
    config: Config
    templates: jinja2.Environment
    engine: AsyncEngine | None = None
    """Set while the app runs (its cleanup_ctx opens and disposes it)."""
    metrics: MetricsSink | None = None
    """What `/metrics` serves: the proxy's metrics, when the console runs inside `serve`."""
    waits_for_database: bool = False
    """Starts even while the database does not answer (inside `serve`)."""
    unchecked: bool = False
    """The database could not be read at start: checked on each request until it can."""
    unavailable: str | None = None
    """Why the database could not be read for the last request (logged once per reason)."""
    folding: asyncio.Task[int] | None = None
    """The overview's folded rows being written in the background (one batch at a time)."""
    fold_refused_at: float | None = None
    """When the database last refused folded rows (read-only, locked): not asked again for
    `FOLD_RETRY` seconds; meanwhile the overview reads the hours and days."""

    @property
    def token(self) -> str | None:
        return self.config.console_token or None

    @property
    def names(self) -> KeyNames:
        """The `[keys]` names of API keys."""
        return KeyNames(self.config.keys)

    def db(self) -> AsyncEngine:
        assert self.engine is not None, "the console app is not running"
        return self.engine

    def fold_later(self, stale: overview.Stale) -> None:
        """The overview's runs to fold, written after the answer that found them (the API
        and the pages only read): one batch at a time; a later request hands over what is
        still not folded."""
        if self.engine is None or (self.folding is not None and not self.folding.done()):
            return
        refused = self.fold_refused_at
        if refused is not None and time.monotonic() - refused < FOLD_RETRY:
            return
        self.folding = asyncio.create_task(self._fold(self.engine, stale))

    async def _fold(self, engine: AsyncEngine, stale: overview.Stale) -> int:
        try:
            done = await overview.fold_top(engine, stale)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("overview: folded rows not written: %s", exc)
            done = 0
        self.fold_refused_at = None if done == len(stale) else time.monotonic()
        return done

    async def stop_folding(self) -> None:
        if self.folding is not None and not self.folding.done():
            self.folding.cancel()
            await asyncio.gather(self.folding, return_exceptions=True)


CONSOLE = web.AppKey("console", Console)


def state(request: web.Request) -> Console:
    return request.app[CONSOLE]
