"""Relaying a WebSocket: a GET under a prefix that asks for an upgrade (SPEC section 11).

The handshake goes to the upstream first, with aiohttp's WebSocket client: the client's
headers as for HTTP (`Authorization`, `OpenAI-Beta`, ...; never the control headers), and
the subprotocols it offered. A refusal (401, 403, 404, 429, ...) reaches the client with the
upstream's status, headers and body, and is recorded. Once the upstream accepted, the client's
handshake is answered with the subprotocol the upstream chose, and two pumps relay frames,
one each way: text and binary frames pass as they came, in order, and the next frame from one
side is read only once the last one was written to the other, so a client that stops reading
slows the upstream side instead of filling a buffer. Pings are answered on each side. A close
passes its code and reason on; a side that vanishes gets the other closed (1001 going away for
a client that left, 1014 bad gateway for an upstream that did).

The record looks at each frame after it was passed on (`wsrecord.SessionRecord`). On
SIGTERM, a session is in flight like any exchange (`inflight`): it gets `shutdown_grace`, then
is cut, and closes both sides with 1001 and records what was under way.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
from aiohttp import WSCloseCode, WSMsgType, web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from proxy.config import Config, Upstream
from proxy.relay.appkeys import APP_CONFIG, APP_IN_FLIGHT, APP_SINKS
from proxy.relay.errors import unreachable
from proxy.relay.headers import response_headers, upstream_headers
from proxy.relay.wsrecord import SessionRecord, subprotocols, ws_url

log = logging.getLogger(__name__)

CUT_CLOSE = 1.0
"""Seconds a session cut at shutdown has to close both sides (within `inflight.CUT_WAIT`)."""
CLOSE_WAIT = 10.0
"""Seconds a side has to answer a close before its connection is dropped."""
ClientSide = web.WebSocketResponse[Literal[False]]
"""The client's socket; frames as bytes, text frames too (relayed without decoding)."""
UpstreamSide = aiohttp.ClientWebSocketResponse[Literal[False]]
_HANDSHAKE_ONLY = ("sec-websocket-", "upgrade", "connection")
"""Headers of the client's handshake that belong to its connection to the proxy only."""
_STOPPING = b"flightrec is shutting down"
_SENDABLE = (range(1000, 1004), range(1007, 1015), range(3000, 5000))
"""Close codes a close frame may carry (RFC 6455 7.4; 1004-1006 and 1015 may not be sent)."""


def wants_websocket(headers: CIMultiDictProxy[str]) -> bool:
    """The request asks for a WebSocket upgrade (asked of GET requests only)."""
    return headers.get("Upgrade", "").lower() == "websocket"


class HandshakeResponse(aiohttp.ClientResponse):
    """The upstream's answer to a handshake, left where the relay reads it (`_HANDSHAKE`):
    aiohttp's `ws_connect` raises on a refusal without the body and hides the headers of an
    acceptance, and the client must get both. The context variable is set in the relay's own
    task (`ws_connect` awaits `start` there)."""

    refusal: bytes = b""

    async def start(self, connection: Any) -> HandshakeResponse:
        await super().start(connection)
        _HANDSHAKE.set(self)
        if self.status != 101:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                self.refusal = await self.read()
        return self


_HANDSHAKE: contextvars.ContextVar[HandshakeResponse | None] = contextvars.ContextVar(
    "handshake", default=None
)


class Sessions:
    """The open WebSocket sessions of the application (for `/metrics`)."""

    def __init__(self) -> None:
        self.open: set[Relay] = set()
        self.frames_closed = [0, 0]
        """Frames relayed by closed sessions: from clients, from upstreams."""

    def open_count(self) -> int:
        return len(self.open)

    def frames(self) -> tuple[int, int]:
        """Frames relayed since start, closed sessions' and open ones': from clients, from
        upstreams."""
        live = [relay.record.frames for relay in self.open]
        return (
            self.frames_closed[0] + sum(frames[0] for frames in live),
            self.frames_closed[1] + sum(frames[1] for frames in live),
        )


APP_WS_CLIENT = web.AppKey("ws_client", aiohttp.ClientSession)
APP_WS_SESSIONS = web.AppKey("ws_sessions", Sessions)


def install(app: web.Application) -> None:
    """Give `app` what its WebSocket sessions need. After the sinks' context: a session closed
    on shutdown is recorded before the sinks stop."""
    app[APP_WS_SESSIONS] = Sessions()
    app.cleanup_ctx.append(_context)


async def _context(app: web.Application) -> AsyncIterator[None]:
    """The WebSocket client session and the open sessions."""
    config = app[APP_CONFIG]
    app[APP_WS_CLIENT] = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None, connect=config.connect_timeout),
        skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
        auto_decompress=False,
        connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
        cookie_jar=aiohttp.DummyCookieJar(),
        response_class=HandshakeResponse,
    )
    yield
    await app[APP_WS_CLIENT].close()


async def websocket(
    request: web.Request, upstream: Upstream, rest: str, began: float, started: float
) -> web.StreamResponse:
    """Relay one WebSocket session; each of its responses is recorded as it completes."""
    config = request.app[APP_CONFIG]
    record = SessionRecord(
        request.headers,
        request.path,
        request.query_string,
        config,
        upstream,
        request.app[APP_SINKS],
        began,
        started,
    )
    record.set_model(request.query.get("model"))
    _HANDSHAKE.set(None)
    try:
        up = await request.app[APP_WS_CLIENT].ws_connect(
            URL(ws_url(upstream.base_url) + rest, encoded=True),
            protocols=subprotocols(request.headers),
            headers=_handshake_headers(request.headers),
            autoclose=False,
            max_msg_size=0,  # the upstream's own limits apply
            timeout=aiohttp.ClientWSTimeout(ws_close=CLOSE_WAIT),
            decode_text=False,
        )
    except aiohttp.WSServerHandshakeError as exc:
        return _refused(record, exc.status, _HANDSHAKE.get())
    except TimeoutError:
        return _unreachable(record, upstream, 504, "timeout", "timed out")
    except aiohttp.ClientError as exc:
        return _unreachable(record, upstream, 502, "upstream_error", f"unreachable: {exc}")
    return await _accepted(request, config, record, up)


async def _accepted(
    request: web.Request, config: Config, record: SessionRecord, up: UpstreamSide
) -> web.StreamResponse:
    handshake = _HANDSHAKE.get()
    client: ClientSide = web.WebSocketResponse(
        protocols=(up.protocol,) if up.protocol else (),
        autoclose=False,
        max_msg_size=config.max_request_bytes,
        compress=False,
        timeout=CLOSE_WAIT,
        decode_text=False,
    )
    if handshake is not None:
        record.request_id = handshake.headers.get("x-request-id")
        client.headers.extend(_passed_back(handshake.headers))
    client.headers["X-Flightrec-Session"] = record.id
    sessions = request.app[APP_WS_SESSIONS]
    in_flight = request.app[APP_IN_FLIGHT]
    relay = Relay(client, up, record, lambda: in_flight.cut)
    sessions.open.add(relay)
    task = in_flight.enter()  # on SIGTERM, a session gets the grace of every exchange in flight
    try:
        await client.prepare(request)
        await relay.run()
    finally:
        in_flight.leave(task)
        sessions.open.discard(relay)
        for side in (0, 1):
            sessions.frames_closed[side] += record.frames[side]
        await up.close()
    return client


def _handshake_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    """The client's headers as the upstream's handshake carries them: as for HTTP, less those
    of the client's own handshake (aiohttp makes the upstream's)."""
    out = upstream_headers(headers, identity_encoding=False)
    for name in list(out.keys()):
        if name.lower().startswith(_HANDSHAKE_ONLY):
            del out[name]
    return out


def _passed_back(headers: CIMultiDictProxy[str]) -> list[tuple[str, str]]:
    """The upstream's handshake headers the client gets (its own handshake is the proxy's)."""
    return [
        (name, value)
        for name, value in response_headers(headers, True)
        if not name.lower().startswith(_HANDSHAKE_ONLY)
    ]


def _refused(
    record: SessionRecord, status: int, handshake: HandshakeResponse | None
) -> web.Response:
    body = handshake.refusal if handshake is not None else b""
    content_type = handshake.headers.get("Content-Type") if handshake is not None else None
    exchange = record.refused(status, body, content_type)
    response = web.Response(status=status, body=body)
    if handshake is not None:
        response.headers.extend(response_headers(handshake.headers, True))
    response.headers["X-Flightrec-Id"] = exchange.id
    response.headers["X-Flightrec-Session"] = record.id
    return response


def _unreachable(
    record: SessionRecord, upstream: Upstream, status: int, outcome: str, what: str
) -> web.Response:
    exchange = record.handshake()
    response = unreachable(exchange, upstream, status, outcome, what)
    exchange.duration_ms = exchange.ttfb_ms = None
    record.deliver(exchange)
    return response


@dataclass(slots=True, frozen=True)
class _End:
    """How a pump ended: which side ended it (`client`, `upstream`, or `proxy`: it is stopping),
    and the close code and reason it sent (None: the side vanished)."""

    side: str
    code: int | None = None
    reason: str = ""


class Relay:
    """One session's two pumps and its end."""

    def __init__(
        self,
        client: ClientSide,
        up: UpstreamSide,
        record: SessionRecord,
        cut: Callable[[], str | None],
    ) -> None:
        self.client = client
        self.up = up
        self.record = record
        self._cut = cut
        """Why shutdown cut the exchanges in flight, once it has (`inflight.InFlight`)."""

    async def run(self) -> None:
        """Relay until one side ends; then record what is under way (at once: the handler may
        be cancelled while the other side closes) and close the other side. Cancelled by
        shutdown past its grace, the session closes both sides with 1001 first."""
        pumps = (
            asyncio.ensure_future(self._from_client()),
            asyncio.ensure_future(self._from_upstream()),
        )
        try:
            done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            end = next(iter(done)).result()
            self.record.end(*_said(end))
            await self._close(end)
        except asyncio.CancelledError:
            for pump in pumps:
                pump.cancel()
            cut = self._cut()
            if cut is None:  # the client's connection was lost
                self.record.end("client_disconnected", "client left mid-response")
                await _quietly(self.up.close(code=WSCloseCode.GOING_AWAY))
            else:
                self.record.end("proxy_error", f"{cut}; session closed (1001)")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(CUT_CLOSE):
                        await self._close(_End("proxy"))
            raise
        finally:
            self.record.end("proxy_error", "the relay failed mid-response")
            await _settle(pumps)

    async def _close(self, end: _End) -> None:
        """Close the other side as `end`'s side ended, then answer the side that ended (or,
        when the proxy ends the session, close both with 1001)."""
        code = end.code if end.code is not None and _sendable(end.code) else None
        reason = end.reason.encode()
        away = WSCloseCode.GOING_AWAY
        if end.side == "client":
            await _quietly(self.up.close(code=code or away, message=reason))
            await _quietly(self.client.close(code=code or away))
        elif end.side == "upstream":
            await _quietly(self.client.close(code=code or WSCloseCode.BAD_GATEWAY, message=reason))
            await _quietly(self.up.close(code=code or away))
        else:
            await _quietly(self.client.close(code=away, message=_STOPPING))
            await _quietly(self.up.close(code=away, message=_STOPPING))

    async def _from_client(self) -> _End:
        return await _pump(self.client, self.up, self.record.from_client, "client", "upstream")

    async def _from_upstream(self) -> _End:
        return await _pump(self.up, self.client, self.record.from_server, "upstream", "client")


async def _pump(
    source: ClientSide | UpstreamSide,
    sink: ClientSide | UpstreamSide,
    seen: Callable[[bytes, float], None],
    side: str,
    other: str,
) -> _End:
    """Relay `source`'s frames to `sink`, each shown to the record once sent; how it ended:
    `side` closed or left, or `other` could not be written to."""
    while True:
        msg = await source.receive()
        kind = msg.type
        try:
            if kind is WSMsgType.TEXT:
                await sink.send_frame(msg.data, WSMsgType.TEXT)
                seen(msg.data, time.perf_counter())
                continue
            if kind is WSMsgType.BINARY:
                await sink.send_bytes(msg.data)
                seen(b"", 0.0)
                continue
        except ConnectionError:
            return _End(other)
        if kind is WSMsgType.CLOSE:
            return _End(side, msg.data, msg.extra or "")
        return _End(side)


def _said(end: _End) -> tuple[str, str]:
    """What a response left under way by `end` records: its outcome and error."""
    who = "client" if end.side == "client" else "upstream"
    said = f"{who} closed the session ({end.code})" if end.code else f"{who} left"
    outcome = "client_disconnected" if who == "client" else "upstream_disconnected"
    return outcome, said + " mid-response"


def _sendable(code: int) -> bool:
    return any(code in allowed for allowed in _SENDABLE)


async def _quietly(closing: Any) -> None:
    """Close one side; a side that is already gone needs no close."""
    with contextlib.suppress(Exception):
        await closing


async def _settle(pumps: tuple[asyncio.Future[_End], ...]) -> None:
    """Let both pumps end (their sides are closed), cancelling one that does not."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait(pumps, timeout=CLOSE_WAIT)
    for pump in pumps:
        if not pump.done():
            pump.cancel()
    for pump in pumps:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pump
