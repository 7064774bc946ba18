"""What every console handler reads: the database, the token, the templates, the config."""

from __future__ import annotations

from dataclasses import dataclass

import jinja2
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.config import Config
from proxy.keynames import KeyNames
from proxy.sinks.metrics import MetricsSink


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


CONSOLE = web.AppKey("console", Console)


def state(request: web.Request) -> Console:
    return request.app[CONSOLE]
