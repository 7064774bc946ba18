"""flightrec's console: server-rendered pages and a read-only JSON API over the record.

`build_console` makes the aiohttp application (its own, not the proxy's: it listens on
`console_host:console_port`), `start_console` starts it next to the proxy in `serve`, and
`run_console` serves it alone for `flightrec console`. Modules: `api` (JSON), `pages` (HTML,
Jinja2 templates in `templates/`, assets in `static/`), `auth` (token, cookie, security
headers), `params` (query strings into store filters), `views` (what templates draw).
"""

from __future__ import annotations

import asyncio
import errno
import logging
from pathlib import Path

import jinja2
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.config import Config, ConfigError
from proxy.console import alerts, api, auth, axes, database, overview_page, pages, session_page
from proxy.console.auth import check_bind
from proxy.console.state import CONSOLE, Console, state
from proxy.sinks.metrics import MetricsSink, registry
from proxy.stopping import until_stopped

__all__ = ["build_console", "check_bind", "listen", "run_console", "start_console"]

log = logging.getLogger(__name__)
HERE = Path(__file__).parent


def templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=pages.when, ms=pages.ms, usd=pages.usd, usd4=axes.usd)
    return env


async def metrics_page(request: web.Request) -> web.Response:
    """Prometheus text format (docs/metrics.md); the console's token guards it."""
    sink = state(request).metrics
    if sink is not None:
        sink.sample()  # what this process holds; other workers' is at most a second old
    found = registry(sink.registry if sink is not None else None)
    if found is None:
        message = "no metrics here: /metrics is on the console of `flightrec serve`"
        body = {"error": {"message": message, "type": "not_found", "param": None}}
        return web.json_response(body, status=404)
    text = await asyncio.to_thread(generate_latest, found)  # workers' files are read from disk
    return web.Response(body=text, headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_console(
    config: Config, metrics: MetricsSink | None = None, *, wait_for_database: bool = False
) -> web.Application:
    """The console app; `wait_for_database`: it starts even while the database does not
    answer (`database.py`)."""
    auth.check_bind(config.console_host, config.console_token)
    login = auth.make_auth_middleware(pages.login_page)
    app = web.Application(middlewares=[login, database.unavailable, api.api_errors, pages.errors])
    app[CONSOLE] = Console(
        config, templates(), metrics=metrics, waits_for_database=wait_for_database
    )
    app.cleanup_ctx.append(database.open_database)
    app.on_response_prepare.append(auth.add_security_headers)
    session_page.add_routes(app)  # before the API's catch-all for unknown routes
    api.add_routes(app)
    pages.add_routes(app)
    alerts.add_routes(app)
    overview_page.add_routes(app)
    app.router.add_get("/metrics", metrics_page)
    app.router.add_static("/static/", HERE / "static", append_version=True)
    return app


async def listen(site: web.TCPSite, key: str) -> None:
    """Start listening; an address another process holds is a `ConfigError` naming the key
    (and flag) that chose it, in one line."""
    try:
        await site.start()
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        raise ConfigError(f"{key}: {site.name} is in use by another process") from None


async def start_console(
    config: Config,
    metrics: MetricsSink | None = None,
    *,
    wait_for_database: bool = False,
    flag: str = "--console-port",
) -> web.AppRunner | None:
    """The console on `console_host:console_port`, or None when `console_port` is 0;
    `/metrics` serves `metrics`. `flag`: the command's flag for `console_port`."""
    if config.console_port == 0:
        return None
    console = build_console(config, metrics, wait_for_database=wait_for_database)
    runner = web.AppRunner(console, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.console_host, config.console_port)
        zero = "; 0: no console" if flag == "--console-port" else ""
        await listen(site, f"console_port ({flag}{zero})")
    except BaseException:
        await runner.cleanup()
        raise
    token = "token required" if config.console_token else "no token: loopback only"
    log.info("console on http://%s:%d (%s)", config.console_host, config.console_port, token)
    return runner


async def run_console(config: Config) -> None:
    """`flightrec console`: serve the console alone until SIGTERM or SIGINT."""
    runner = await start_console(config, flag="--port")
    if runner is None:
        raise ConfigError("console_port: 0 means no console; give a port")
    try:
        await until_stopped()
    finally:
        await runner.cleanup()
