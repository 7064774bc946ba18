"""The forwarding handler: one exchange, from the request's arrival to its record.

`forward` runs the steps in order, each in its own module:

1. route the path to an upstream (`paths.route`); answer errors in OpenAI's shape (`errors`);
   past `max_connections`, answer 503 (`load`);
2. read the body and, for a stream, ask the upstream for its usage (`usage_option`); past
   `max_streams`, answer 503;
3. send it upstream (`_send_upstream`);
4. relay the answer to the client through the tee (`relay`, `tee`, `reader`);
5. in `finally`, whatever happened, have the record completed a moment later and handed to the
   sinks (`record.conclude`, `sinks`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable

import aiohttp
from aiohttp import web
from yarl import URL

from proxy.config import Config, Upstream
from proxy.exchange import id_place
from proxy.relay.appkeys import (
    APP_BLOCKED,
    APP_CONFIG,
    APP_DEFERRED,
    APP_IN_FLIGHT,
    APP_LOAD,
    APP_SESSION,
    APP_SINKS,
)
from proxy.relay.budgets import over_budget
from proxy.relay.errors import (
    budget_exceeded,
    not_routed,
    proxy_failed,
    refuse_path,
    too_large,
    too_slow,
    unreachable,
)
from proxy.relay.headers import upstream_headers
from proxy.relay.load import Load, asks_to_stream, shed
from proxy.relay.paths import Refused, route
from proxy.relay.record import Record, conclude
from proxy.relay.response import relay
from proxy.relay.usage_option import UpstreamBody, upstream_body
from proxy.relay.websocket import wants_websocket, websocket
from proxy.stream.endpoints import endpoint

log = logging.getLogger(__name__)


async def forward(request: web.Request) -> web.StreamResponse:
    """One exchange, whatever its outcome; the record goes to the sinks from `finally`."""
    began = time.time()
    started = time.perf_counter()
    place = id_place()  # now: ids sort as the requests came
    app = request.app  # a property chain: read once per request
    config = app[APP_CONFIG]
    routed = route(config.upstreams, request.raw_path)
    if routed is None:
        return not_routed(request)
    refused = isinstance(routed, Refused)
    upstream, rest = (routed.upstream, routed.rest) if isinstance(routed, Refused) else routed
    if request.method == "GET" and not refused and wants_websocket(request.headers):
        return await websocket(request, upstream, rest, began, started)
    record = Record(place, request.method, upstream, rest, began)
    later = app[APP_DEFERRED]
    sinks = app[APP_SINKS]
    later.under_way += 1
    in_flight = app[APP_IN_FLIGHT]
    task = in_flight.enter()
    load = app[APP_LOAD]
    try:
        if refused:
            return refuse_path(record.ensure_exchange(), upstream)
        if load.too_many_connections():
            exchange = record.ensure_exchange()
            return shed(exchange, "max_connections", load.max_connections, close=True)
        return await _exchange(request, app, config, load, upstream, rest, record, started)
    except asyncio.CancelledError:
        exchange = record.ensure_exchange()
        if in_flight.cut:  # shutdown cancelled it, past its grace (`inflight`)
            exchange.report("proxy_error", in_flight.cut)
        else:
            exchange.report(
                "client_disconnected", "client disconnected; upstream request cancelled"
            )
        raise
    except Exception as exc:  # the record must survive a bug here, and the client gets a 500
        log.exception("exchange %s failed inside the proxy", record.id)
        return proxy_failed(record.ensure_exchange(), exc)
    finally:
        exchange = record.ensure_exchange()
        exchange.duration_ms = (time.perf_counter() - started) * 1000
        # Completed off the way of the client's next request (`Deferred`).
        tee, record.tee = record.tee, None  # the tee refers to the record: no cycle left
        later.under_way -= 1
        in_flight.leave(task)
        later.add(conclude, exchange, request, tee, sinks, record.controls)


async def _exchange(
    request: web.Request,
    app: web.Application,
    config: Config,
    load: Load,
    upstream: Upstream,
    rest: str,
    record: Record,
    started: float,
) -> web.StreamResponse:
    """Read the request, send it upstream, relay the answer."""
    try:
        if request.content.is_eof():  # nearly every body came with its headers: no timer
            body = await request.read()
        else:
            body = await _read_slow_body(request, config.client_body_timeout)
    except TimeoutError:
        return await too_slow(request, record.ensure_exchange(), config.client_body_timeout)
    except web.HTTPRequestEntityTooLarge:
        return too_large(record.ensure_exchange(), config)
    path = request.raw_path.partition("?")[0]
    path_endpoint = endpoint(path)
    inject = config.stream_usage == "inject" and path_endpoint.stream_options
    outgoing = record.body = upstream_body(body, inject=inject)
    blocked = app[APP_BLOCKED]
    if blocked.budgets and (budget := over_budget(blocked, request.headers, body)) is not None:
        return budget_exceeded(record.ensure_exchange(), budget)
    streams = asks_to_stream(outgoing)
    if streams and not load.take_stream():
        return shed(record.ensure_exchange(), "max_streams", load.max_streams, close=False)
    url = URL(upstream.base_url + rest, encoded=True)
    try:
        try:
            answer = await _send_upstream(request, app[APP_SESSION], url, outgoing, record)
        except TimeoutError:
            return unreachable(record.ensure_exchange(), upstream, 504, "timeout", "timed out")
        except aiohttp.ClientError as exc:
            return unreachable(
                record.ensure_exchange(), upstream, 502, "upstream_error", f"unreachable: {exc}"
            )
        async with answer:
            return await relay(
                request, app, config, answer, record, path_endpoint, outgoing.injected, started
            )
    finally:
        if streams:
            load.end_stream()


async def _read_slow_body(request: web.Request, seconds: float) -> bytes:
    """The request body, not all here with its headers; TimeoutError when the client has not
    sent all of it `seconds` after them."""
    async with asyncio.timeout(seconds):
        return await request.read()


def _send_upstream(
    request: web.Request,
    session: aiohttp.ClientSession,
    url: URL,
    body: UpstreamBody,
    record: Record,
) -> Awaitable[aiohttp.ClientResponse]:
    """Send the request upstream; awaited, the answer once its headers are in. The control
    headers left out go to `record.controls`. Not a coroutine of its own: awaiting the
    session's request directly spares a layer each time the exchange waits on the upstream."""
    controls: list[tuple[str, str]] = []
    headers = upstream_headers(request.headers, identity_encoding=body.injected, controls=controls)
    record.controls = controls
    return session.request(
        request.method,
        url,
        headers=headers,
        data=body.sent or None,
        allow_redirects=False,
    )
