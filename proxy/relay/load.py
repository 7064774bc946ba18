"""Load shedding: a worker past its limits answers 503 at once instead of taking on more.

Two limits per worker process (`serve --workers N` has N of each):

- `max_connections`: open client connections. While more are open, every request that arrives
  gets a 503 and its connection is closed, which brings the count back down. A connection is
  counted from its accept, so the worker keeps accepting (and answering) past the limit
  instead of leaving connections in the kernel's queue, where an overloaded server's clients
  time out or are reset.
- `max_streams`: streamed answers (`"stream": true`) being relayed. A stream past it gets a 503
  before anything goes upstream; its connection stays open for the client's next request.

Either 503 is in OpenAI's error shape with `Retry-After`, so the SDKs' own retries wait and try
again, and it is recorded like every exchange (outcome `proxy_error`).
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from proxy.exchange import Exchange
from proxy.relay.errors import error_response
from proxy.relay.usage_option import UpstreamBody, parse_json_body

RETRY_AFTER = 1
"""Seconds a shed client is asked to wait (`Retry-After`)."""


@dataclass(slots=True)
class Load:
    """What this worker carries now, against its limits."""

    max_connections: int
    max_streams: int
    connections: int = 0
    """Open client connections (counted by `relay.connections`)."""
    streams: int = 0
    """Streams being relayed."""

    def too_many_connections(self) -> bool:
        return self.connections > self.max_connections

    def take_stream(self) -> bool:
        """Count one more stream; False (nothing counted) when the worker has all it may."""
        if self.streams >= self.max_streams:
            return False
        self.streams += 1
        return True

    def end_stream(self) -> None:
        self.streams -= 1


def asks_to_stream(body: UpstreamBody) -> bool:
    """Whether the request asks for a streamed answer. The body is parsed already when the
    proxy asks for usage; otherwise only one that names `"stream"` is."""
    payload = body.payload
    if payload is None and b'"stream"' in body.original:
        payload = parse_json_body(body.original)
    return isinstance(payload, dict) and payload.get("stream") in (True, "true")


def shed(exchange: Exchange, limit: str, value: int, *, close: bool) -> web.Response:
    """The 503 for a request past `limit`; `close` ends its connection after the answer."""
    exchange.status = 503
    exchange.report("proxy_error", f"overloaded: this worker is at {limit} ({value})")
    message = f"flightrec: {exchange.error}; retry in {RETRY_AFTER} s"
    response = error_response(503, message, "server_error", "overloaded", exchange.id)
    response.headers["Retry-After"] = str(RETRY_AFTER)
    if close:
        response.force_close()
    return response
