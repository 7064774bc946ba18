"""The console's database: opened with the app, and a clear answer while it cannot be read.

`flightrec console` alone stops at start when the database cannot be read, as every command
does. Inside `serve`, which starts while its PostgreSQL is down (`store.recorder.open_recorder`),
the console starts too and checks the database on each request until it answers. A database
that cannot be used while a page is made (down, unreachable, locked) is a 503 saying why, as
a page or as the API's JSON error, not a bare 500.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from proxy.console import api, pages
from proxy.console.state import CONSOLE, state
from proxy.store.engine import StoreError, create_engine, describe, gone
from proxy.store.read import check_readable, require_sqlite_file

log = logging.getLogger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_NO_DATABASE = ("/static/", "/metrics", "/login", "/logout", "/api/openapi.json")
"""Paths answered without the database."""


async def open_database(app: web.Application) -> AsyncIterator[None]:
    """The app's cleanup context: the engine, checked now unless the database does not
    answer and the console may wait for it."""
    console = app[CONSOLE]
    url = console.config.db_url
    require_sqlite_file(url)
    engine = console.engine = create_engine(url)
    try:
        try:
            await check_readable(engine)
        except StoreError as exc:  # inside serve, the recorder may be making the schema now
            if not console.waits_for_database:
                raise
            log.warning("%s: the console says so until the database can be read", exc)
            console.unchecked = True
        yield
    finally:
        console.engine = None  # no fold starts now
        await console.stop_folding()
        await engine.dispose()


@web.middleware
async def unavailable(request: web.Request, handler: Handler) -> web.StreamResponse:
    """503 with the reason while the database cannot be read; one warning per reason."""
    console = state(request)
    try:
        if console.unchecked and not request.path.startswith(_NO_DATABASE):
            await check_readable(console.db())
            console.unchecked = False
        response = await handler(request)
    except StoreError as exc:  # only `check_readable`'s: handlers' are answered inside
        reason = str(exc)
    except Exception as exc:
        transport = request.transport
        if not gone(exc) or transport is None or transport.is_closing():
            raise  # a bug (aiohttp logs it, a 500), or the client is gone
        reason = describe(exc)
    else:
        console.unavailable = None
        return response
    if reason != console.unavailable:
        log.warning("console: database unavailable: %s", reason)
        console.unavailable = reason
    message = f"database unavailable: {reason}"
    if request.path.startswith("/api/"):
        return api.error(503, message, "database_unavailable", None)
    return pages.render(request, "error.html", 503, title="Database unavailable", message=message)
