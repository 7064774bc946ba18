"""What the proxy allows a client connection, where aiohttp's server sets no limit of its own.

- `client_header_timeout`: a connection must deliver a request's complete headers within this
  many seconds of connecting, or of the first bytes of a later request that reach an idle
  kept-alive connection; otherwise it is closed. A slowloris (headers a byte at a time) or a
  connection that never sends anything holds its slot no longer than that. (The start of a
  request pipelined in the same read as the one before it is timed from the next bytes that
  arrive, or else by `keepalive_timeout`.)
- `keepalive_timeout`: an idle kept-alive connection is closed after this many seconds
  without a new request (aiohttp's own timer; its default is an hour).
- Open connections are counted for `max_connections` (`relay.load`).
- A malformed request (bad request line, headers too large or conflicting) gets a 400, or a
  431 for a head over the size limits, in OpenAI's error shape, and one info line: aiohttp
  logged each as an ERROR with a traceback, so anyone could fill the log.

This is nginx's model (`client_header_timeout`, `keepalive_timeout`). aiohttp builds one
`RequestHandler` per connection from its `web.Server`; the runner below makes it build ours.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler

from proxy.relay.errors import error_response
from proxy.relay.load import Load

log = logging.getLogger(__name__)

_TOO_LARGE = "Too many headers"
"""How aiohttp's parsers begin the message for a request with more headers than allowed."""


class Runner(web.AppRunner):
    """An `AppRunner` whose connections get `client_header_timeout`; `keepalive_timeout` and
    the other handler options pass through to aiohttp as usual."""

    def __init__(
        self, app: web.Application, *, load: Load, header_timeout: float, **kwargs: Any
    ) -> None:
        super().__init__(app, **kwargs)
        self._load = load
        self._header_timeout = header_timeout

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()
        return _Server(made, self._load, self._header_timeout)


class _Server(web.Server):
    """aiohttp's server as the app built it, making `_Handler`s instead of `RequestHandler`s."""

    def __init__(self, made: web.Server, load: Load, header_timeout: float) -> None:
        super().__init__(
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            loop=made._loop,
            **made._kwargs,
        )
        self._load = load
        self._header_timeout = header_timeout

    def __call__(self) -> RequestHandler:
        return _Handler(self, self._load, self._header_timeout, loop=self._loop, **self._kwargs)


class _Handler(RequestHandler):
    __slots__ = ("_counted", "_header_deadline", "_header_timeout", "_load")

    def __init__(
        self, manager: web.Server, load: Load, header_timeout: float, **kwargs: Any
    ) -> None:
        super().__init__(manager, **kwargs)
        self._load = load
        self._counted = False
        self._header_timeout = header_timeout
        self._header_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._load.connections += 1
        self._counted = True
        self._start_header_clock()

    def data_received(self, data: bytes) -> None:
        parsed = self._request_count
        RequestHandler.data_received(self, data)  # (no `super()` object: once per read)
        if self._request_count > parsed:
            if self._header_deadline is not None:
                self._stop_header_clock()
        elif self._header_deadline is None and self._waiting_for_request():
            # The first bytes of the next request, its headers not all here: a request
            # whose headers come whole (nearly every one) never needs a timer.
            self._start_header_clock()

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_header_clock()
        if self._counted:
            self._counted = False
            self._load.connections -= 1
        super().connection_lost(exc)

    def _waiting_for_request(self) -> bool:
        """Between requests: no request is being handled and none is queued."""
        return self._waiter is not None and not self._waiter.done()

    def _start_header_clock(self) -> None:
        self._header_deadline = self._loop.call_later(self._header_timeout, self._headers_late)

    def _stop_header_clock(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_late(self) -> None:
        self._header_deadline = None
        if self._waiting_for_request():
            # Debug only: one line per connection would let a slowloris fill the log.
            log.debug(
                "closed a connection from %s: no complete request headers in %.0f s",
                self.peername,
                self._header_timeout,
            )
            self.force_close()

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError):  # the proxy's own failure: aiohttp's way
            return super().handle_error(request, status, exc, message)
        reason = _reason(exc)
        too_large = isinstance(exc, LineTooLong) or reason.startswith(_TOO_LARGE)
        log.info("malformed request from %s: %s", request.remote, reason)
        response = error_response(
            431 if too_large else 400,
            f"flightrec: malformed request: {reason}",
            "invalid_request_error",
        )
        response.force_close()
        return response


def _reason(exc: HttpProcessingError) -> str:
    """What was wrong, without the bytes the client sent: they may hold an API key."""
    if isinstance(exc, LineTooLong):
        return f"a request line or header longer than {exc.args[1]} bytes"
    # aiohttp's messages name the problem first, then quote the offending bytes.
    first = (exc.message or "").strip().splitlines()[:1]
    text = first[0].partition(":")[0].strip() if first else ""
    if not text or "'" in text or '"' in text:
        return f"not valid HTTP ({type(exc).__name__})"
    return text
