"""Builds the relay's aiohttp application (`proxy.serve` runs it).

The application owns two long-lived things, both in `cleanup_ctx` so they live exactly as long
as the server: the pooled upstream `ClientSession` and the sinks (the recorder first, then any
others, `proxy.sinks.fanout`); `run` adds the retention task when retention is configured.
Shutdown order matters: stop listening, let in-flight exchanges finish (bounded by
`shutdown_grace`), complete the records still waiting, then stop the sinks in reverse order,
each delivering everything it holds.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence

import aiohttp
from aiohttp import web

from proxy.alert_rules import Blocked
from proxy.config import Config
from proxy.pricing import Prices, PriceUpdates, upstream_providers, warm
from proxy.privacy.keep import Keep
from proxy.relay.appkeys import (
    APP_BLOCKED,
    APP_CONFIG,
    APP_DEFERRED,
    APP_DEFERRED_READS,
    APP_IN_FLIGHT,
    APP_LOAD,
    APP_RECORDER,
    APP_SESSION,
    APP_SINKS,
)
from proxy.relay.connections import Runner
from proxy.relay.deferred import READ_DELAY, Deferred
from proxy.relay.forward import forward
from proxy.relay.inflight import InFlight
from proxy.relay.load import Load
from proxy.relay.websocket import install as install_websockets
from proxy.sinks.fanout import Recorder, Sink, Sinks

log = logging.getLogger(__name__)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready: the proxy relays and keeps every record safe (its journal takes them), though the
    database may be down; the body says the database's state. `/readyz/db` also needs the
    database to take records as they come."""
    recorder = request.app[APP_RECORDER]
    reason = recorder.readiness() if request.path == "/readyz/db" else recorder.safety()
    body = {"database": recorder.database_state() or "up"}
    if reason is None:
        return web.json_response({"status": "ready", **body})
    return web.json_response({"status": "not ready", "reason": reason, **body}, status=503)


async def _client_session(app: web.Application) -> AsyncIterator[None]:
    config = app[APP_CONFIG]
    app[APP_SESSION] = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(
            total=None, connect=config.connect_timeout, sock_read=config.read_timeout
        ),
        # The client's bytes go upstream as they are: no headers of aiohttp's own, no
        # decompression (the client gets the upstream's bytes; the tee decodes for the record).
        skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
        auto_decompress=False,
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
        cookie_jar=aiohttp.DummyCookieJar(),
    )
    yield
    await app[APP_SESSION].close()


async def _price_updates(app: web.Application) -> AsyncIterator[None]:
    """genai-prices' background refresh, only with `price_update = true`: without it the
    proxy makes no call for prices."""
    config = app[APP_CONFIG]
    warm()
    updates = PriceUpdates(config.price_update_url) if config.price_update else None
    if updates is not None:
        updates.start()
    yield
    if updates is not None:
        updates.stop()


async def _sinks(app: web.Application) -> AsyncIterator[None]:
    await app[APP_SINKS].start()
    yield
    app[APP_DEFERRED].flush(close=True)  # records still being completed go to the sinks first
    await app[APP_SINKS].stop()


def build_app(config: Config, recorder: Recorder, *, sinks: Sequence[Sink] = ()) -> web.Application:
    """The proxy; every finished exchange goes to `recorder`, then to each of `sinks`."""
    app = web.Application(client_max_size=config.max_request_bytes)
    app[APP_CONFIG] = config
    app[APP_RECORDER] = recorder
    app[APP_BLOCKED] = Blocked()
    prices = Prices(config.prices, upstream_providers(config.upstreams), live=config.price_update)
    app[APP_SINKS] = Sinks([recorder, *sinks], Keep(config), config.shutdown_grace, prices)
    app[APP_DEFERRED] = Deferred()
    app[APP_DEFERRED_READS] = Deferred(READ_DELAY)
    app[APP_IN_FLIGHT] = InFlight()
    app[APP_LOAD] = Load(config.max_connections, config.max_streams)
    app.cleanup_ctx.append(_client_session)
    app.cleanup_ctx.append(_price_updates)
    app.cleanup_ctx.append(_sinks)
    install_websockets(app)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/readyz/db", readyz)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def make_runner(app: web.Application, config: Config) -> web.AppRunner:
    return Runner(
        app,
        load=app[APP_LOAD],
        header_timeout=config.client_header_timeout,
        keepalive_timeout=config.keepalive_timeout,
        handler_cancellation=config.cancel_on_disconnect,
        shutdown_timeout=config.shutdown_grace,
        access_log=None,
    )
