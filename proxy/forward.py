"""The forwarding handler: one request in, one upstream request out, the response teed back.

Follow one exchange from top to bottom: `forward` matches the upstream, `_relay` sends the
request and copies the response to the client piece by piece (each piece is written before the
proxy looks at it), `StreamTee` parses and reassembles what went by, and the `finally` in
`forward` hands the exchange on, whatever the outcome, to `_conclude`, which completes the
record a moment later (`Later`) and gives it to the recorder.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import re
import time
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from yarl import URL

from .config import Config, Upstream
from .exchange import Exchange, format_id, id_place
from .forms import FORM_KEYS, form_fields
from .headers import control_headers, response_headers, upstream_headers
from .keys import APP_CONFIG, APP_LATER, APP_READ_LATER, APP_RECORDER, APP_SESSION, APP_SINKS
from .paths import Refused, mask_query, route
from .recorder import Recorder
from .sinks import Sink
from .tee import StreamTee, without_null_usage

log = logging.getLogger(__name__)

USAGE_PATHS = ("/chat/completions", "/completions")
"""Endpoints that accept `stream_options.include_usage`."""


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


class _Response(web.StreamResponse):
    """A response whose headers may wait for the first piece of its body and leave with it, as
    aiohttp's own `web.Response` does: one write and one packet instead of two, so the client
    has its first byte sooner and wakes once (bench/).

    A non-streamed answer's headers always wait (for its first piece, or its end). A stream's
    wait only when its first event came with the upstream's headers and so is in hand;
    otherwise they leave at once, as they left the upstream: a client may be waiting on them
    before the first event."""

    def __init__(self, *, status: int, reason: str | None, hold_headers: bool) -> None:
        super().__init__(status=status, reason=reason)
        self._send_headers_immediately = not hold_headers


def key_identity(headers: Any) -> tuple[str | None, str | None]:
    """`key_hash` (SHA-256 hex prefix) and `key_hint` of the API key; the key never leaves."""
    key: str | None = None
    auth = headers.get("Authorization")
    if auth:
        scheme, _, credentials = auth.partition(" ")
        key = credentials.strip() if scheme.lower() == "bearer" else auth.strip()
    key = key or headers.get("api-key") or headers.get("x-api-key")
    return _identify(key) if key else (None, None)


@functools.lru_cache(maxsize=1024)
def _identify(key: str) -> tuple[str, str]:
    """Clients send the same few keys over and over: hash each once."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    hint = f"{key[:3]}...{key[-4:]}" if len(key) >= 12 else "..."
    return digest, hint


async def forward(request: web.Request) -> web.StreamResponse:
    began = time.time()
    started = time.perf_counter()
    place = id_place()  # now: ids sort as the requests came
    config = request.app[APP_CONFIG]
    found = route(config.upstreams, request.raw_path)
    if found is None:
        return error_response(
            404,
            f"flightrec: no upstream serves {request.path}",
            "invalid_request_error",
            "unknown_url",
        )
    if isinstance(found, Refused):
        upstream, rest = found.upstream, found.rest
    else:
        upstream, rest = found
    record = _Record(place, request.method, upstream, rest, began)
    tees: list[StreamTee] = []
    try:
        if isinstance(found, Refused):
            return _refuse_path(record.exchange(), upstream)
        return await _relay(request, config, upstream, rest, record, started, tees)
    except asyncio.CancelledError:
        exchange = record.exchange()
        if exchange.outcome == "ok":  # else the upstream failed first: that is what happened
            exchange.outcome = "client_disconnected"
            exchange.error = "client disconnected; upstream request cancelled"
        raise
    except Exception as exc:  # the record must survive a bug here, and the client gets a 500
        exchange = record.exchange()
        log.exception("exchange %s failed inside the proxy", exchange.id)
        exchange.outcome = "proxy_error"
        exchange.error = f"{type(exc).__name__}: {exc}"
        exchange.status = 500
        return error_response(500, f"flightrec: {exc}", "proxy_error", None, exchange.id)
    finally:
        exchange = record.exchange()
        exchange.duration_ms = (time.perf_counter() - started) * 1000
        app = request.app
        app[APP_LATER].add(_conclude, exchange, request, tees, app[APP_RECORDER], app[APP_SINKS])


class _Record:
    """Makes an exchange's record once the client has the first byte of the answer.

    Filling an `Exchange` (forty fields) cost a stream ~20 us of its first byte at c=1
    (bench/) when done before the request went upstream, and about as much when scheduled for
    while the upstream works (~7 us to schedule, ~14 more until the answer was in: the proxy
    and the upstream share two cores). Until the first piece of the answer has gone to the
    client the proxy keeps what the record needs here; `exchange()` makes the record the
    first time it is asked for: by the tee, a moment after that piece was written, or by
    whatever ends the exchange sooner (a request that fails before it goes upstream). The id
    is minted when the request arrives (`id`), so ids sort as requests came. The decoded path
    and the query are filled in by `_conclude`.
    """

    __slots__ = (
        "_answer",
        "_began",
        "_exchange",
        "_method",
        "_rest",
        "_upstream",
        "body",
        "id",
        "payload",
    )

    def __init__(
        self, place: int, method: str, upstream: Upstream, rest: str, began: float
    ) -> None:
        self.id = format_id(place)
        self._method = method
        self._upstream = upstream
        self._rest = rest
        self._began = began
        self._exchange: Exchange | None = None
        self._answer: tuple[float, aiohttp.ClientResponse, str] | None = None
        self.body: bytes | None = None
        self.payload: Any = None
        """The request body parsed, when the proxy had to read it; else `_conclude` does."""

    def answered(self, ttfb_ms: float, response: aiohttp.ClientResponse, content_type: str) -> None:
        """The upstream's answer has come: what the record says of it, filled in when the
        record is made."""
        self._answer = (ttfb_ms, response, content_type)
        if self._exchange is not None:
            self._fill_answer(self._exchange)

    def exchange(self) -> Exchange:
        exchange = self._exchange
        if exchange is None:
            upstream = self._upstream
            exchange = self._exchange = Exchange.start(
                self._method,
                "",
                "",
                upstream.name,
                exchange_id=self.id,
                started_at=self._began,
            )
            exchange.request_body = self.body
            exchange.request_json = self.payload
            exchange.upstream_url = upstream.base_url + self._rest.partition("?")[0]
            if self._answer is not None:
                self._fill_answer(exchange)
        return exchange

    def _fill_answer(self, exchange: Exchange) -> None:
        assert self._answer is not None
        ttfb_ms, response, content_type = self._answer
        exchange.ttfb_ms = ttfb_ms
        exchange.status = response.status
        exchange.upstream_request_id = response.headers.get("x-request-id")
        exchange.content_type = content_type or None
        exchange.stream = exchange.stream or content_type.startswith("text/event-stream")


def _conclude(
    exchange: Exchange,
    request: web.Request,
    tees: list[StreamTee],
    recorder: Recorder,
    sinks: tuple[Sink, ...],
) -> None:
    """Complete the record and hand it to the recorder, then to each sink: after the
    response, and after the client's next request has gone on (`Later`), so that none of it
    delays a byte."""
    try:
        exchange.path = request.path
        exchange.query = mask_query(request.query_string)
        for tee in tees:
            tee.finish()
            if exchange.outcome == "ok" and (exchange.status or 0) >= 400:
                exchange.outcome = "upstream_error"
                exchange.error = _error_text(exchange.response_json, exchange.response_body)
        _describe_request(exchange, request.headers)
    except Exception as exc:  # a bug here must not cost the record
        log.exception("exchange %s: completing the record failed", exchange.id)
        if exchange.outcome == "ok":
            exchange.outcome = "proxy_error"
            exchange.error = f"completing the record failed: {type(exc).__name__}: {exc}"
    finally:
        if exchange.omit_request:
            exchange.request_body = exchange.request_json = None
        if exchange.omit_response:
            exchange.response_body = exchange.response_json = exchange.raw_stream_gz = None
        recorder.record(exchange)
        for sink in sinks:
            sink.accept(exchange)


async def _relay(
    request: web.Request,
    config: Config,
    upstream: Upstream,
    rest: str,
    record: _Record,
    started: float,
    tees: list[StreamTee],
) -> web.StreamResponse:
    try:
        body = await _read_body(request, config.client_body_timeout)
    except TimeoutError:
        return await _too_slow(request, record.exchange(), config.client_body_timeout)
    except web.HTTPRequestEntityTooLarge:
        exchange = record.exchange()
        exchange.outcome = "proxy_error"
        exchange.status = 413
        exchange.error = f"request body larger than max_request_bytes ({config.max_request_bytes})"
        return error_response(
            413,
            f"flightrec: {exchange.error}",
            "invalid_request_error",
            "request_too_large",
            exchange.id,
        )

    record.body = body
    endpoint = request.raw_path.partition("?")[0]
    injected = guessed = False
    if config.stream_usage == "inject" and endpoint.endswith(USAGE_PATHS):
        streaming = asks_for_stream(body)
        if streaming is None:  # only parsing can tell
            payload = record.payload = _parse_json_body(body)
            if isinstance(payload, dict) and payload.get("stream") is True:
                body, injected = _ask_for_usage(payload, body)
        elif streaming:
            body, injected, guessed = _with_usage_option(body), True, True

    url = URL(upstream.base_url + rest, encoded=True)
    session = request.app[APP_SESSION]
    try:
        upstream_response = await _send(session, request, url, body, injected)
        if guessed and upstream_response.status == 400 and not _wants_stream(record):
            # The bytes misled `asks_for_stream` (its "stream" key was a nested object's) and
            # the upstream refused the request, as OpenAI refuses stream_options without a
            # stream. Send the client's request as it came (no answer was generated).
            log.debug("%s: no stream after all; sent again without stream_options", url)
            upstream_response.close()
            injected = False
            upstream_response = await _send(session, request, url, record.body, injected)
    except TimeoutError:
        return _unreachable(record.exchange(), upstream, 504, "timeout", "timed out")
    except aiohttp.ClientError as exc:
        return _unreachable(
            record.exchange(), upstream, 502, "upstream_error", f"unreachable: {exc}"
        )

    async with upstream_response:
        content_type = upstream_response.headers.get("Content-Type", "")
        record.answered((time.perf_counter() - started) * 1000, upstream_response, content_type)
        is_sse = content_type.startswith("text/event-stream")
        encoding = upstream_response.headers.get("Content-Encoding", "identity").lower()
        # Withholding an event means cutting bytes out of the body, which only works uncompressed.
        withhold = injected and is_sse and encoding in ("", "identity")

        response = _Response(
            status=upstream_response.status,
            reason=upstream_response.reason,
            hold_headers=not is_sse or upstream_response.content.total_bytes > 0,
        )
        response.headers.extend(response_headers(upstream_response.headers, withhold))
        response.headers["X-Flightrec-Id"] = record.id
        await response.prepare(request)

        tee = StreamTee(
            record.exchange,
            path=endpoint,
            encoding=encoding,
            sse=is_sse,
            injected=injected and is_sse,  # an upstream may take the option and answer no stream
            withhold=withhold,
            max_record_bytes=config.max_record_bytes,
            max_stream_record_bytes=config.max_stream_record_bytes,
            started=started,
            keep_raw=config.store_raw_stream,
            later=request.app[APP_READ_LATER],
        )
        tees.append(tee)  # finished by `_conclude`, off the way of the next request
        try:
            await _pump(response, upstream_response, tee, config.cancel_on_disconnect)
            exchange = record.exchange()
            if exchange.outcome in ("upstream_disconnected", "timeout"):
                # A cut body must look cut to the client too: the connection closes without
                # the body's end (aiohttp would write it once the handler returns).
                response.force_close()
                if request.transport is not None:
                    request.transport.close()
            elif exchange.outcome != "client_disconnected":
                try:
                    await response.write_eof()
                except ConnectionResetError:
                    exchange.outcome = "client_disconnected"
                    exchange.error = "client disconnected before the end of the body"
        except Exception as exc:  # the response has started: a second one cannot be sent
            exchange = record.exchange()
            log.exception("exchange %s failed while relaying", exchange.id)
            exchange.outcome = "proxy_error"
            exchange.error = f"{type(exc).__name__}: {exc}"
            response.force_close()
        return response


async def _read_body(request: web.Request, seconds: float) -> bytes:
    """The request body; TimeoutError when the client has not sent all of it `seconds` after
    its headers. Nearly every body came with its headers and is read without a timer."""
    if request.content.is_eof():
        return await request.read()
    async with asyncio.timeout(seconds):
        return await request.read()


async def _too_slow(request: web.Request, exchange: Exchange, seconds: float) -> web.Response:
    """Answer 408 and end the connection on our side: the client reads the answer to its
    end at once (aiohttp still reads and drops what it sends for a while before it closes:
    closing with unread bytes would reset the connection, losing the answer)."""
    exchange.status = 408
    exchange.outcome = "proxy_error"
    exchange.error = (
        f"the client did not send its whole body within client_body_timeout ({seconds:g} s)"
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


async def _send(
    session: aiohttp.ClientSession, request: web.Request, url: URL, body: bytes, injected: bool
) -> aiohttp.ClientResponse:
    """Send the request upstream; the response once its headers are in."""
    return await session.request(
        request.method,
        url,
        headers=upstream_headers(request.headers, identity_encoding=injected),
        data=body or None,
        allow_redirects=False,
    )


async def _pump(
    response: web.StreamResponse,
    upstream_response: aiohttp.ClientResponse,
    tee: StreamTee,
    cancel_on_disconnect: bool,
) -> None:
    """Copy the upstream body to the client as it arrives; the tee looks at each piece a
    moment after it was written, except when it must cut out the usage event the proxy asked
    for and the piece may hold it. The exchange's record is made (`tee.exchange`) once the first
    piece is on its way."""
    client_here = True
    whole = False

    async def send(data: bytes) -> bool:
        """Write to the client; False once it has gone."""
        nonlocal client_here
        try:
            await response.write(data)
            return True
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            client_here = False
            tee.exchange.outcome = "client_disconnected"
            tee.exchange.error = "client disconnected"
            return False

    try:
        async for piece in upstream_response.content.iter_any():
            if not tee.withhold:
                tee.feed_later(piece, delivered=client_here and await send(piece))
            elif tee.passes(piece):
                out = without_null_usage(piece)
                tee.feed_later(piece, delivered=client_here and await send(out), written=out)
            else:
                out = tee.feed(piece)
                # Even b"": headers held for a first piece go out now.
                if client_here and await send(out):
                    tee.delivered(out)
            if not client_here and cancel_on_disconnect:
                tee.exchange.error = "client disconnected; upstream request cancelled"
                upstream_response.close()
                break
        whole = client_here  # the body ended, and the client was there for all of it
    except TimeoutError:
        tee.exchange.outcome = "timeout"
        tee.exchange.error = "upstream went silent mid-body (read_timeout)"
    except aiohttp.ClientPayloadError as exc:
        tee.exchange.outcome = "upstream_disconnected"
        tee.exchange.error = f"upstream body broken: {exc}"
    except aiohttp.ClientConnectionError as exc:
        tee.exchange.outcome = "upstream_disconnected"
        tee.exchange.error = f"upstream connection lost: {exc}"
    finally:
        rest = tee.end(whole=whole)
    if rest and client_here and await send(rest):
        tee.delivered(rest)


def _describe_request(exchange: Exchange, headers: Any) -> None:
    """What the record says about the request besides its bytes: the control headers, the
    key, the model, the user. Worked out by `_conclude`, so that none of it stands between
    the client and a byte."""
    controls = control_headers(headers)
    exchange.tags = controls.tags
    exchange.omit_request = controls.omit_request
    exchange.omit_response = controls.omit_response
    exchange.replay_of = controls.replay_of
    exchange.traceparent = headers.get("traceparent")
    exchange.key_hash, exchange.key_hint = key_identity(headers)
    exchange.user = controls.user
    payload = exchange.request_json
    if payload is None and exchange.request_body:
        payload = exchange.request_json = _parse_json_body(exchange.request_body)
    if payload is None and exchange.request_body:  # an upload names its model in a form field
        payload = form_fields(exchange.request_body, headers.get("Content-Type", ""), FORM_KEYS)
    if isinstance(payload, dict):
        model = payload.get("model")
        exchange.model = model if isinstance(model, str) else None
        exchange.stream = exchange.stream or payload.get("stream") in (True, "true")
        user = payload.get("user") or payload.get("safety_identifier")
        exchange.user = controls.user or (user if isinstance(user, str) else None)


def _refuse_path(exchange: Exchange, upstream: Upstream) -> web.Response:
    """A path whose dot segments lead out of the upstream's base path never goes upstream."""
    exchange.status = 400
    exchange.outcome = "proxy_error"
    exchange.error = f"path leaves the base path of upstream {upstream.name!r}"
    message = f"flightrec: {exchange.error} ({upstream.prefix})"
    return error_response(400, message, "invalid_request_error", "invalid_path", exchange.id)


def _unreachable(
    exchange: Exchange, upstream: Upstream, status: int, outcome: Any, what: str
) -> web.Response:
    exchange.status = status
    exchange.outcome = outcome
    exchange.error = f"upstream {upstream.name!r} ({upstream.base_url}) {what}"
    type_ = "upstream_timeout" if status == 504 else "upstream_unreachable"
    return error_response(status, f"flightrec: {exchange.error}", type_, None, exchange.id)


def _parse_json_body(body: bytes) -> Any:
    if not body or body[:1] not in (b"{", b"["):
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


_USAGE_OPTION = b',"stream_options":{"include_usage":true}}'
_STREAM = b'"stream'
_ESCAPED_KEY_CHAR = re.compile(rb"\\u00[5-7]")
"""A `\\u` escape of a character that "stream_options" is spelled with (or its neighbours
in ASCII): a key spelled so is found only by parsing."""
READ_LIMIT = 8 * 1024
"""Bodies up to this many bytes have "stream" read off their bytes; longer ones are parsed
(`asks_for_stream`)."""


def asks_for_stream(body: bytes) -> bool | None:
    """Whether a request body asks for a stream, read off its bytes without parsing them:
    orjson wakes cold at concurrency 1 and cost a stream ~10 us of its first byte (bench/).

    The answer is from the one place the key `"stream"` appears: no `"stream"` at all is
    False; `"stream"` once, as a key, with `true` or `false` after it is that. Otherwise, or
    when `"stream_options"` is there too (to be merged, not added) or the body does not start
    with `{`, None: only parsing can tell. A JSON string cannot hold `"stream"` unescaped, so
    a lone match is a key, but it may be a nested object's: then the request asks for no
    stream at all, and a True here is wrong; `_relay` sends the request again as it came if
    the upstream refuses it (400), and an upstream that takes the option answers no stream,
    so nothing is withheld. A body with a `\\u` escape of a lowercase letter or `_` is
    parsed: JSON may spell a key so (`"str\\u0065am"`), and searching for the plain key
    would miss it; the look for a backslash first costs ~0.1 us.

    One pass over the bytes finds both keys. Past `READ_LIMIT` bytes, None: searching costs
    ~0.35 ns a byte here, twice what parsing costs (a 50 KB body: ~18 us against ~10), and
    the record parses the body anyway, so a long body is parsed once, up front.
    """
    if len(body) > READ_LIMIT or (b"\\" in body and _ESCAPED_KEY_CHAR.search(body)):
        return None
    key = -1
    at = body.find(_STREAM)
    while at != -1:
        after = at + len(_STREAM)
        follows = body[after : after + 1]
        if follows == b'"':
            if key != -1 or body[at - 1 : at] == b"\\":
                return None
            key = at
        elif follows == b"_" and body.startswith(b'_options"', after):
            return None
        at = body.find(_STREAM, after)
    if key == -1:
        return False
    value = body[key + len(_STREAM) + 1 : key + 40].lstrip()
    if value[:1] != b":":
        return None  # a string value "stream", not the key
    value = value[1:].lstrip()
    if value.startswith(b"false"):
        return False
    if value.startswith(b"true") and body[:1] == b"{" and body.rstrip().endswith(b"}"):
        return True
    return None


def _with_usage_option(body: bytes) -> bytes:
    """A JSON object's bytes with `stream_options.include_usage` added after its last key."""
    return body.rstrip()[:-1] + _USAGE_OPTION


def _wants_stream(record: _Record) -> bool:
    """What parsing says `asks_for_stream` guessed: the body asks for a stream."""
    if record.payload is None:
        record.payload = _parse_json_body(record.body or b"")
    payload = record.payload
    return isinstance(payload, dict) and payload.get("stream") is True


def _ask_for_usage(payload: dict[str, Any], body: bytes) -> tuple[bytes, bool]:
    """The body with `stream_options.include_usage` set, unless the client asked already.

    Without `stream_options` in the body (the usual case) the key is added after the client's
    last one, so the upstream gets the client's own bytes plus that key (numbers, escapes and
    spacing as sent), and nothing is serialised on the way to the first byte. `payload` is
    `body` parsed, so the body is an object ending in `}`.
    """
    if "stream_options" not in payload:
        return _with_usage_option(body), True
    options = payload.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict) or options.get("include_usage") is True:
        return body, False
    return orjson.dumps({**payload, "stream_options": {**options, "include_usage": True}}), True


def _error_text(response_json: Any, response_body: bytes | None) -> str | None:
    if isinstance(response_json, dict):
        error = response_json.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if error is not None:
            return orjson.dumps(error).decode()
    if response_body:
        return response_body[:1000].decode("utf-8", "replace")
    return None
