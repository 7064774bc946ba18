"""The answers the proxy gives itself, in OpenAI's error shape, and what the record says of them.

Each answer that ends an exchange early (no upstream for the path, a path leaving its base, a
body too slow or too large, an upstream out of reach) fills the exchange's status, outcome and
error, and answers with the same text, so the client's SDK raises its usual exception.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from proxy.alert_rules import Budget
from proxy.config import Config, Upstream
from proxy.exchange import Exchange


def error_body(message: str, type_: str, code: str | None = None) -> bytes:
    """An error in OpenAI's shape, so SDKs raise their usual exception."""
    return orjson.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}})


def error_response(
    status: int, message: str, type_: str, code: str | None = None, exchange_id: str | None = None
) -> web.Response:
    headers = {"X-Flightrec-Id": exchange_id} if exchange_id else None
    return web.Response(
        status=status,
        body=error_body(message, type_, code),
        content_type="application/json",
        headers=headers,
    )


def not_routed(request: web.Request) -> web.Response:
    """No upstream serves the path: answered, not recorded."""
    message = f"flightrec: no upstream serves {request.path}"
    return error_response(404, message, "invalid_request_error", "unknown_url")


def refuse_path(exchange: Exchange, upstream: Upstream) -> web.Response:
    """A path whose dot segments lead out of the upstream's base path never goes upstream."""
    exchange.status = 400
    exchange.report("proxy_error", f"path leaves the base path of upstream {upstream.name!r}")
    message = f"flightrec: {exchange.error} ({upstream.prefix})"
    return error_response(400, message, "invalid_request_error", "invalid_path", exchange.id)


def too_large(exchange: Exchange, config: Config) -> web.Response:
    exchange.status = 413
    exchange.report(
        "proxy_error",
        f"request body larger than max_request_bytes ({config.max_request_bytes})",
    )
    message = f"flightrec: {exchange.error}"
    return error_response(413, message, "invalid_request_error", "request_too_large", exchange.id)


async def too_slow(request: web.Request, exchange: Exchange, seconds: float) -> web.Response:
    """Answer 408 and end the connection on our side: the client reads the answer to its
    end at once (aiohttp still reads and drops what it sends for a while before it closes:
    closing with unread bytes would reset the connection, losing the answer)."""
    exchange.status = 408
    exchange.report(
        "proxy_error",
        f"the client did not send its whole body within client_body_timeout ({seconds:g} s)",
    )
    response = error_response(
        408, f"flightrec: {exchange.error}", "invalid_request_error", "request_timeout", exchange.id
    )
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    transport = request.transport
    if transport is not None and transport.can_write_eof():
        transport.write_eof()
    return response


def unreachable(
    exchange: Exchange, upstream: Upstream, status: int, outcome: Any, what: str
) -> web.Response:
    exchange.status = status
    exchange.report(outcome, f"upstream {upstream.name!r} ({upstream.base_url}) {what}")
    type_ = "upstream_timeout" if status == 504 else "upstream_unreachable"
    return error_response(status, f"flightrec: {exchange.error}", type_, None, exchange.id)


def budget_exceeded(exchange: Exchange, budget: Budget) -> web.Response:
    """A request in the scope of a spent `action = "block"` budget never goes upstream."""
    exchange.status = 429
    limit = f"limit ${budget.limit_usd:g} a {budget.period}"
    exchange.report("proxy_error", f"budget {budget.name!r} exceeded ({limit})")
    message = f"flightrec: {exchange.error}"
    return error_response(429, message, "insufficient_quota", "budget_exceeded", exchange.id)


def proxy_failed(exchange: Exchange, exc: Exception) -> web.Response:
    """A bug in the proxy: the record says what broke, the client gets a 500."""
    exchange.report("proxy_error", f"{type(exc).__name__}: {exc}")
    exchange.status = 500
    return error_response(500, f"flightrec: {exc}", "proxy_error", None, exchange.id)
