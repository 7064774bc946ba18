"""The record of one WebSocket connection: each response of the session becomes an exchange as
soon as it completes, and goes to the sinks at once (so it is journaled before the session
ends, SPEC section 11).

`SessionRecord` is told each frame after the relay passed it on. It hands text frames to the
reader for the path: Realtime (`/realtime`, `stream.realtime`), the Responses API's WebSocket
mode (`/responses`, `stream.responses_ws`), or none (any other path is relayed and counted
only). What the upgrade request said applies to every exchange of the session: the key (from
`Authorization`, or a browser's `openai-insecure-api-key.<key>` subprotocol: hash and hint
only), the control headers, `traceparent`. The session id is the client's
`X-Flightrec-Session`, else a new id.

How a response's exchange reads: a Responses WebSocket response is the streamed
`POST /v1/responses` it stands for (method `POST`, its body the `response.create` event as a
request body), so `replay` re-sends it over HTTP; a Realtime response has method `WS`. Both
have `upstream_url` `ws://` or `wss://`, `stream` true, status 200 once the server answered.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson
from multidict import CIMultiDictProxy

from proxy.config import Config, Upstream
from proxy.exchange import Exchange, new_id
from proxy.relay.headers import control_headers, key_identity
from proxy.relay.paths import mask_query
from proxy.sinks.fanout import Sinks
from proxy.stream.realtime import RealtimeReader
from proxy.stream.responses_ws import ResponsesWsReader
from proxy.stream.wsresponse import Budget, WsResponse, message

log = logging.getLogger(__name__)

INSECURE_KEY = "openai-insecure-api-key."
"""The subprotocol prefix a browser puts its key in (it cannot set `Authorization`)."""


def ws_url(base_url: str) -> str:
    """The WebSocket URL of an upstream's base URL: `ws://` for `http://`, `wss://` for
    `https://`."""
    scheme, sep, rest = base_url.partition("://")
    return {"http": "ws", "https": "wss"}.get(scheme.lower(), scheme) + sep + rest


def subprotocols(headers: CIMultiDictProxy[str]) -> list[str]:
    """The subprotocols the client offered, in its order."""
    offered: list[str] = []
    for value in headers.getall("Sec-WebSocket-Protocol", ()):
        offered.extend(part.strip() for part in value.split(",") if part.strip())
    return offered


def session_key(headers: CIMultiDictProxy[str]) -> tuple[str | None, str | None]:
    """`key_hash` and `key_hint` of the connection's key: `Authorization` (and the other key
    headers), else a browser's key subprotocol."""
    found = key_identity(headers)
    if found[0] is not None:
        return found
    for protocol in subprotocols(headers):
        if protocol.startswith(INSECURE_KEY) and len(protocol) > len(INSECURE_KEY):
            return key_identity({"Authorization": "Bearer " + protocol[len(INSECURE_KEY) :]})
    return None, None


class SessionRecord:
    __slots__ = (
        "_began",
        "_controls",
        "_headers",
        "_key",
        "_method",
        "_path",
        "_query",
        "_sinks",
        "_started",
        "_upstream",
        "_url",
        "frames",
        "id",
        "reader",
        "request_id",
        "responses",
    )

    def __init__(
        self,
        headers: CIMultiDictProxy[str],
        path: str,
        query: str,
        config: Config,
        upstream: Upstream,
        sinks: Sinks,
        began: float,
        started: float,
    ) -> None:
        self._controls = control_headers(headers)
        self.id = headers.get("X-Flightrec-Session") or new_id()
        self._key = session_key(headers)
        self._headers = headers.get("traceparent")
        self._path, self._query = path, mask_query(query)
        self._upstream = upstream
        self._url = ws_url(upstream.base_url)
        self._sinks = sinks
        self._began, self._started = began, started
        budget = Budget(config.max_session_record_bytes)
        self.reader: RealtimeReader | ResponsesWsReader | None = None
        self._method = "WS"
        if path.endswith("/realtime"):
            self.reader = RealtimeReader(None, store_audio=config.store_audio, budget=budget)
        elif path.endswith("/responses"):
            self.reader = ResponsesWsReader(budget=budget)
            self._method = "POST"
        self.frames = [0, 0]
        """Frames relayed: from the client, from the upstream."""
        self.responses = 0
        self.request_id: str | None = None
        """The upstream's `x-request-id` of the handshake."""

    def set_model(self, model: str | None) -> None:
        """The connection's `model` query parameter, until the session names its own."""
        if isinstance(self.reader, RealtimeReader):
            self.reader.model = model

    def from_client(self, data: bytes, now: float) -> None:
        """A frame the client sent, once the upstream has it (b"": a binary frame)."""
        self.frames[0] += 1
        if self.reader is not None and data:
            self._read(data, now, True)

    def from_server(self, data: bytes, now: float) -> None:
        """A frame the upstream sent, once the client has it (b"": a binary frame)."""
        self.frames[1] += 1
        if self.reader is not None and data:
            self._read(data, now, False)

    def _read(self, data: bytes, now: float, from_client: bool) -> None:
        reader = self.reader
        assert reader is not None
        try:
            read = reader.from_client if from_client else reader.from_server
            self._deliver(read(data, now))
        except Exception:  # a bug costs the record, never the session
            self._broken()

    def _broken(self) -> None:
        log.exception("session %s: reading a frame failed; its responses are not recorded", self.id)
        self.reader = None

    def end(self, outcome: str, error: str) -> None:
        """The session is over: record each response still under way, as far as it came.
        Only the first call counts: frames still relayed after it are not read."""
        reader, self.reader = self.reader, None
        if reader is not None:
            self._deliver(reader.end(outcome, error, time.perf_counter()))

    def handshake(self) -> Exchange:
        """An exchange for the handshake itself (one the upstream did not accept)."""
        exchange = self._start("GET", self._started)
        exchange.stream = False
        exchange.duration_ms = exchange.ttfb_ms = (time.perf_counter() - self._started) * 1000
        return exchange

    def deliver(self, exchange: Exchange) -> None:
        self._sinks.accept(exchange)

    def refused(self, status: int, body: bytes, content_type: str | None) -> Exchange:
        """The upstream refused the handshake: one exchange says so."""
        exchange = self.handshake()
        exchange.status = status
        exchange.content_type = content_type
        exchange.response_body = body
        try:
            exchange.response_json = orjson.loads(body) if body else None
        except orjson.JSONDecodeError:
            exchange.response_json = None
        error = exchange.response_json
        said = message(error) if error is not None else f"handshake refused: {status}"
        exchange.report("upstream_error", said)
        self._sinks.accept(exchange)
        return exchange

    def _deliver(self, finished: list[WsResponse]) -> None:
        for response in finished:
            self.responses += 1
            self._sinks.accept(self._exchange(response))

    def _start(self, method: str, at: float) -> Exchange:
        exchange = Exchange.start(
            method,
            self._path,
            self._query,
            self._upstream.name,
            started_at=self._began + (at - self._started),
        )
        exchange.upstream_url = self._url + self._path_rest()
        exchange.session = self.id
        exchange.key_hash, exchange.key_hint = self._key
        controls = self._controls
        exchange.tags = dict(controls.tags)
        exchange.user = controls.user
        exchange.omit_request = controls.omit_request
        exchange.omit_response = controls.omit_response
        exchange.traceparent = self._headers
        exchange.upstream_request_id = self.request_id
        return exchange

    def _path_rest(self) -> str:
        prefix = "" if self._upstream.prefix == "/" else self._upstream.prefix
        return self._path[len(prefix) :] if self._path.startswith(prefix) else self._path

    def _exchange(self, response: WsResponse) -> Exchange:
        exchange = self._start(self._method, response.asked_at)
        exchange.stream = True
        exchange.status = response.status
        exchange.model = response.model
        if response.request is not None:
            exchange.request_body = orjson.dumps(response.request)
            exchange.request_json = response.request
            user = response.request.get("user") or response.request.get("safety_identifier")
            exchange.user = exchange.user or (user if isinstance(user, str) else None)
        answer: Any = response.response
        exchange.response_json = answer
        if isinstance(answer, dict):
            model = answer.get("model")
            exchange.response_model = model if isinstance(model, str) else None
        exchange.usage = response.usage
        exchange.usage_source = "reported" if response.usage is not None else "missing"
        exchange.report(response.outcome, response.error)
        exchange.chunks = response.events
        exchange.parse_errors = list(response.notes)
        exchange.ttfb_ms = _ms(response.asked_at, response.created_at)
        exchange.ttft_ms = _ms(response.asked_at, response.first_delta_at)
        exchange.duration_ms = _ms(response.asked_at, response.ended_at)
        return exchange


def _ms(start: float, end: float | None) -> float | None:
    return None if end is None else max(0.0, (end - start) * 1000)
