"""What the proxy does with the response bytes once they are on their way to the client.

`StreamTee` decompresses (for the record only: the client gets the upstream's bytes), parses
Server-Sent Events, reassembles chat completions and fills the exchange. It does no I/O, so the
forwarder stays a plain copy loop. The one time it must look before the client gets the bytes
is when the proxy asked for stream usage itself: then `Withholder` cuts exactly that usage event
out of the stream (and the `"usage":null` members the option added to the others) and releases
everything else up to the start of the event being received.

It looks at a piece the client already has a moment later (`feed_later`, through `Later`), not
right after writing it: the kernel wakes the reader of a local socket on the writer's CPU, so
work the proxy does straight after a write delays the client reading it (bench/: ~40 us on a
stream's first byte).
"""

from __future__ import annotations

import enum
import logging
import re
import time
import zlib
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from .assemble import ChatAssembler
from .assemble_other import TERMINAL_EVENTS, CompletionAssembler, ResponsesAssembler
from .exchange import Exchange
from .later import Later
from .rawcopy import RawCopy
from .sse import Event, SSEParser

log = logging.getLogger(__name__)

USAGE_ENDPOINTS = ("/chat/completions", "/completions", "/embeddings", "/responses")
_USAGE_VALUE = re.compile(rb'"usage"\s*:(?!\s*null)')
"""A usage key whose value is not null: the only kind of event the proxy ever withholds."""


def _holds_usage(piece: bytes) -> bool:
    """Whether `piece` has a usage key whose value is not null. Every event of a stream the
    proxy asked usage for has `"usage":null` (as OpenAI writes it): two counts tell those
    apart from the usage event for less than the regular expression costs a stream's first
    byte (it wakes cold at concurrency 1, bench/), which is kept for other spellings."""
    keys = piece.count(b'"usage"')
    return (
        keys > 0 and keys != piece.count(b'"usage":null') and _USAGE_VALUE.search(piece) is not None
    )


_NULL_USAGE = re.compile(rb',\s*"usage"\s*:\s*null\b|"usage"\s*:\s*null\s*,\s*')
"""A `"usage": null` member however spaced, with the comma that separates it."""


def without_null_usage(events: bytes) -> bytes:
    """Whole events with their `"usage":null` members removed. An upstream asked for stream
    usage adds one to every chunk (OpenAI does); a client that did not ask gets the chunks
    as they would have come without the option. A JSON string cannot hold `"usage"` with
    unescaped quotes, so every match is a key."""
    events = events.replace(b',"usage":null', b"")
    if b'"usage"' in events:  # another spelling (or a usage object, which stays)
        events = _NULL_USAGE.sub(b"", events)
    return events


def _read_past_the_bound(event: Event) -> bool:
    """Whether an event past `max_stream_record_bytes` is parsed: one that may carry usage,
    an error or the end of the stream, told by its bytes (content chunks are not)."""
    return event.event in TERMINAL_EVENTS or _holds_usage(event.data) or b'"error"' in event.data


def _past_the_bound(chunk: dict[str, Any]) -> dict[str, Any]:
    """What the record takes from an event past `max_stream_record_bytes`: its usage, error
    and type, and a Responses snapshot without its output (which repeats the whole stream)."""
    kept: dict[str, Any] = {key: chunk[key] for key in ("type", "usage", "error") if key in chunk}
    response = chunk.get("response")
    if isinstance(response, dict):
        kept["response"] = {key: value for key, value in response.items() if key != "output"}
    return kept


class _Final(enum.Enum):
    """Where a stream's final event is, for the client."""

    NOT_SEEN = enum.auto()
    UNSENT = enum.auto()
    """In bytes held back until now, that the forwarder is writing (`StreamTee.delivered`)."""
    DELIVERED = enum.auto()
    LOST = enum.auto()
    """Arrived after the client had gone."""


class Assembler(Protocol):
    @property
    def usage(self) -> dict[str, Any] | None: ...

    def add(self, chunk: dict[str, Any]) -> bool: ...

    def result(self) -> Any: ...


def assembler_for(path: str) -> Assembler | None:
    """The reassembler for a streaming endpoint; None where events are kept as they came."""
    if path.endswith("/chat/completions"):
        return ChatAssembler()
    if path.endswith("/completions"):
        return CompletionAssembler()
    if path.endswith("/responses"):
        return ResponsesAssembler()
    return None


class Decoder:
    """Incremental gzip/deflate decompression of a body, for the record."""

    def __init__(self, encoding: str) -> None:
        self._encoding = encoding
        self._z: Any = None

    @classmethod
    def for_encoding(cls, encoding: str) -> Decoder | None:
        return None if encoding in ("", "identity") else cls(encoding)

    def feed(self, data: bytes) -> bytes:
        if self._z is None:
            if self._encoding in ("gzip", "x-gzip"):
                wbits = 16 + zlib.MAX_WBITS
            else:  # "deflate" is meant to be zlib-wrapped, but servers send raw deflate too
                wbits = zlib.MAX_WBITS if data[:1] and data[0] & 0x0F == 8 else -zlib.MAX_WBITS
            self._z = zlib.decompressobj(wbits)
        return bytes(self._z.decompress(data))

    def flush(self) -> bytes:
        return bytes(self._z.flush()) if self._z is not None else b""


class Withholder:
    """Holds the bytes of the event being received, and drops the events it is told to."""

    def __init__(self) -> None:
        self._held = bytearray()
        self._base = 0
        """Stream offset of `_held[0]`."""
        self._skip_lf = False
        """A dropped event ended on CR; an LF right after it belongs to it (CRLF cut in two)."""

    def release(self, piece: bytes, drops: list[tuple[int, int]], safe: int) -> bytes:
        self._held += piece
        out = bytearray()
        for start, end in drops:
            out += self._take(start)
            dropped = self._held[: end - self._base]
            del self._held[: end - self._base]
            self._base = end
            self._skip_lf = dropped.endswith(b"\r")
        out += self._take(safe)
        return bytes(out)

    def _take(self, upto: int) -> bytes:
        n = upto - self._base
        if n <= 0:
            return b""
        taken = bytes(self._held[:n])
        del self._held[:n]
        self._base = upto
        if self._skip_lf:
            self._skip_lf = False
            if taken.startswith(b"\n"):
                taken = taken[1:]
        return taken


class StreamTee:
    def __init__(
        self,
        exchange: Exchange | Callable[[], Exchange],
        *,
        path: str,
        encoding: str,
        sse: bool,
        injected: bool,
        withhold: bool,
        max_record_bytes: int,
        max_stream_record_bytes: int = 16 * 1024 * 1024,
        started: float,
        keep_raw: bool = False,
        later: Later | None = None,
    ) -> None:
        self._exchange = exchange if isinstance(exchange, Exchange) else None
        self._make_exchange = exchange
        """The record, or what makes it: the forwarder has it made once the first piece of the
        body is on its way (`forward._Record`)."""
        self._path = path
        """The endpoint's path: which reassembler, and whether usage and [DONE] are expected."""
        self.withhold = withhold
        self._injected = injected
        self._started = started
        self._max = max_record_bytes
        """Bytes of a non-stream body the record keeps."""
        self._max_stream = max_stream_record_bytes
        """Bytes of a stream the record is made from; past them only what the record cannot
        do without is read (`_past_the_bound`)."""
        self._stream_bytes = 0
        self._truncated = False
        self._events_past = 0
        """Events that came past `_max_stream` and were not recorded."""
        self._encoding = encoding
        self._is_sse = sse
        self._later = later
        self._waiting: list[tuple[bytes, float, bool, bytes | None]] = []
        """Pieces the tee has not looked at yet: when each arrived, whether it went to the
        client then, and what went when that was not the piece itself."""
        self._end_waits = False
        """`end` was called and left the end of the body to `finish`."""
        self._ended_at = 0.0
        self._raw: RawCopy | None = None
        """The bytes the client received and when (for playback)."""
        self._keep_raw = keep_raw and sse
        self._set_up = False
        """The parts below are made on first use: after the first piece went to the client."""
        self._final = _Final.NOT_SEEN
        """Where the stream's final event ([DONE], a Responses stream's terminal event) is."""
        self._client_has_all = True
        """Every piece of the body so far was written to the client (once one was not, none
        after it is: the client has gone)."""
        self._ended_whole = False
        """The upstream's body ended normally (not cut, not abandoned)."""

    @property
    def exchange(self) -> Exchange:
        exchange = self._exchange
        if exchange is None:
            assert callable(self._make_exchange)
            exchange = self._exchange = self._make_exchange()
        return exchange

    def _setup(self) -> None:
        self._set_up = True
        encoding = self._encoding
        self._readable = encoding in ("", "identity", "gzip", "x-gzip", "deflate")
        self._decoder = Decoder.for_encoding(encoding) if self._readable else None
        if not self._readable:
            self._problem(
                f"response Content-Encoding {encoding!r} cannot be decoded for the record"
            )
        sse = self._is_sse
        self._sse = SSEParser() if sse else None
        self._assembler = assembler_for(self._path) if sse else None
        self._withholder = Withholder() if self.withhold else None
        self._body = bytearray()
        self._body_full = False
        self._events: list[Any] = []
        self._done = False
        self._stream_error: Any = None
        self._usage: dict[str, Any] | None = None

    def _between_events(self) -> bool:
        """Every byte so far belongs to a whole event (or a comment or a blank line)."""
        if self._waiting:  # (asked only when withholding) waiting pieces all passed: they end so
            return True
        if not self._set_up:  # nothing parsed yet
            return self._is_sse
        sse = self._sse
        return sse is not None and sse.settled

    def passes(self, piece: bytes) -> bool:
        """Whether `piece` may go to the client before the tee looks at it although an event is
        being withheld: it starts and ends between events and none of them carries usage. So
        only the usage event itself waits to be parsed, not the first byte of every stream."""
        return (
            self._between_events()
            and piece.endswith((b"\n\n", b"\n\r\n"))
            and not _holds_usage(piece)
        )

    def feed_later(self, piece: bytes, *, delivered: bool, written: bytes | None = None) -> None:
        """Look at `piece`, the next piece of the body, a moment from now (with `later`; at
        once without); `delivered`: it was written to the client just now, as it came or as
        `written` (without its `"usage":null` members)."""
        now = time.perf_counter()
        self._client_has_all = delivered
        if self._later is None:
            self._look(piece, now, delivered, written)
            return
        if not self._waiting:
            self._later.add(self._catch_up)
        self._waiting.append((piece, now, delivered, written))

    def feed(self, piece: bytes) -> bytes:
        """Look at the next piece of the body now; returns the bytes the client may have."""
        self._catch_up()
        self._client_has_all = False  # until `delivered` says the bytes released went out
        return self._look(piece, time.perf_counter(), None)

    def _catch_up(self) -> None:
        """Look at the pieces waiting, in order."""
        if not self._waiting:
            return
        waiting, self._waiting = self._waiting, []
        try:
            for piece, arrived, delivered, written in waiting:
                self._look(piece, arrived, delivered, written)
        except Exception as exc:  # a bug: the client has the bytes, the record says what broke
            log.exception("exchange %s: reading the body failed", self.exchange.id)
            self._readable = False
            exchange = self.exchange
            if exchange.outcome == "ok":
                exchange.outcome = "proxy_error"
                exchange.error = f"reading the body failed: {type(exc).__name__}: {exc}"

    def _look(
        self, piece: bytes, arrived: float, delivered: bool | None, written: bytes | None = None
    ) -> bytes:
        """Parse `piece`; `delivered`: it was written to the client, as `written` if that is
        given (None: the caller writes what this returns and says so with `delivered`)."""
        if delivered:
            self._delivered(piece if written is None else written, arrived)
        if not self._set_up:
            self._setup()
        data = piece
        if self._decoder is not None:
            try:
                data = self._decoder.feed(piece)
            except zlib.error as exc:
                self._problem(f"response body could not be decompressed: {exc}")
                self._decoder = None
                self._readable = False
        if not self._readable:
            return piece
        if self._sse is None:
            self._capture(data)
            return piece
        self._stream_bytes += len(data)
        if self._stream_bytes > self._max_stream:
            self._truncated = True
        drops = self._on_events(self._sse.feed(data), arrived, delivered)
        if self._withholder is None:
            return piece
        safe = self._sse.pending_start
        out = self._withholder.release(piece, drops, self._sse.offset if safe is None else safe)
        return without_null_usage(out)

    def delivered(self, data: bytes) -> None:
        """`data`, bytes `feed` or `end` returned, has been written to the client just now."""
        self._catch_up()
        self._client_has_all = True
        if self._final is _Final.UNSENT:
            self._final = _Final.DELIVERED
        self._delivered(data, time.perf_counter())

    def _delivered(self, data: bytes, when: float) -> None:
        if not data:
            return
        self.exchange.response_bytes += len(data)
        if self._keep_raw and not self._truncated:
            if self._raw is None:
                self._raw = RawCopy()
            self._raw.add(data, (when - self._started) * 1000)

    def end(self, *, whole: bool = False) -> bytes:
        """The body has ended (`whole`: normally, not cut or abandoned) or broken; returns
        bytes still held back, which the client may have now. Bytes are held back only in the
        middle of an event: otherwise the rest of the body is read by `finish`, off the way of
        the body's end."""
        self._ended_at = time.perf_counter()
        self._ended_whole = whole
        if not self.withhold or self._between_events():
            self._end_waits = True
            return b""
        self._catch_up()
        return self._end_body(None)

    def _end_body(self, delivered: bool | None) -> bytes:
        """Parse what is left of the body (events in it came when it ended); returns bytes
        still held. `delivered`: as for `_look`, of the body's last bytes."""
        if not self._set_up:
            self._setup()
        rest = b""
        if self._readable and self._decoder is not None:
            try:
                tail = self._decoder.flush()
            except zlib.error as exc:
                self._problem(f"response body could not be decompressed: {exc}")
                tail = b""
            if self._sse is None:
                self._capture(tail)
            elif tail:
                self._on_events(self._sse.feed(tail), self._ended_at, delivered)
        if self._sse is not None and self._readable:
            drops = self._on_events(self._sse.flush(), self._ended_at, delivered)
            if self._withholder is not None:
                rest = without_null_usage(self._withholder.release(b"", drops, self._sse.offset))
        return rest

    def _on_events(
        self, events: list[Event], arrived: float, delivered: bool | None
    ) -> list[tuple[int, int]]:
        """Record `events`; returns the spans to withhold. `delivered`: as for `_look`."""
        drops: list[tuple[int, int]] = []
        exchange = self.exchange
        for event in events:
            exchange.chunks += 1
            data = event.data
            if data == b"[DONE]":
                self._done = True
                self._final_event(delivered)
                continue
            if self._truncated and not _read_past_the_bound(event):
                self._events_past += 1
                continue
            try:
                chunk = orjson.loads(data)
            except orjson.JSONDecodeError:
                self._problem(f"event {exchange.chunks}: data is not JSON: {data[:120]!r}")
                continue
            if not isinstance(chunk, dict):
                self._problem(f"event {exchange.chunks}: data is not a JSON object")
                continue
            if chunk.get("error") is not None or chunk.get("type") == "error":
                self._stream_error = chunk.get("error") or chunk
            if chunk.get("type") in TERMINAL_EVENTS:
                self._final_event(delivered)
            if self.withhold and chunk.get("choices") == [] and chunk.get("usage"):
                drops.append((event.start, event.end))
            if self._truncated:
                self._events_past += 1
                chunk = _past_the_bound(chunk)
            if self._assembler is not None:
                try:
                    produced = self._assembler.add(chunk)
                except (AttributeError, TypeError, ValueError) as exc:
                    # A chunk of an unexpected shape is the upstream's problem, never the
                    # client's: it was relayed already; the record notes it and goes on.
                    self._problem(f"event {exchange.chunks}: unexpected chunk shape: {exc}")
                    continue
                if produced and exchange.ttft_ms is None:
                    exchange.ttft_ms = (arrived - self._started) * 1000
            else:
                self._generic_event(chunk, arrived)
        return drops

    def _final_event(self, delivered: bool | None) -> None:
        """The stream's final event has come; `delivered`: as for `_look`."""
        if self._final is not _Final.NOT_SEEN:
            return
        if delivered is None:
            self._final = _Final.UNSENT
        else:
            self._final = _Final.DELIVERED if delivered else _Final.LOST

    def _generic_event(self, chunk: dict[str, Any], arrived: float) -> None:
        """Streams no assembler knows: keep the events as they came, and any usage."""
        if self.exchange.ttft_ms is None:
            self.exchange.ttft_ms = (arrived - self._started) * 1000
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        if not self._truncated:
            self._events.append(chunk)

    def _capture(self, data: bytes) -> None:
        if self._body_full or not data:
            return
        if len(self._body) + len(data) > self._max:
            self._body_full = True
            self._problem("response body larger than max_record_bytes: not recorded")
            return
        self._body += data

    def finish(self) -> None:
        """Fill the exchange from what went by. Called once the client has the whole response:
        building the record must not delay the end of the body."""
        if not self._set_up:
            self._setup()
        self._catch_up()
        if self._end_waits:
            self._end_waits = False
            self._end_body(self._client_has_all)
        exchange = self.exchange
        if exchange.outcome == "client_disconnected" and self._client_has_answer():
            # The client left after it had the whole answer (the openai SDK closes the
            # response at [DONE], without waiting for the body's end): nothing was lost.
            exchange.outcome, exchange.error = "ok", None
        result: Any = None
        if self._assembler is not None:
            result = self._assembler.result()
            self._usage = self._assembler.usage
            if isinstance(self._assembler, ResponsesAssembler):
                self._done = self._assembler.finished
                self._stream_error = self._stream_error or self._assembler.error
        elif self._sse is not None:
            result = self._events
        elif self._body and not self._body_full:
            exchange.response_body = bytes(self._body)
            if "json" in (exchange.content_type or ""):
                try:
                    result = orjson.loads(self._body)
                except orjson.JSONDecodeError:
                    self._problem("response body is not valid JSON")
        exchange.response_json = result
        if self._truncated:
            exchange.parse_errors.append(
                f"stream truncated in the record: it is larger than max_stream_record_bytes "
                f"({self._max_stream}); {self._events_past} later events not recorded "
                f"(their usage, errors and the final event were read)"
            )
        if self._raw is not None:
            exchange.raw_stream_gz = self._raw.gzip()
            exchange.raw_pacing = self._raw.pacing()
        if isinstance(result, dict):
            if self._sse is None and isinstance(result.get("usage"), dict):
                self._usage = result["usage"]
            model = result.get("model")
            exchange.response_model = model if isinstance(model, str) else None
            fingerprint = result.get("system_fingerprint")
            exchange.system_fingerprint = fingerprint if isinstance(fingerprint, str) else None

        exchange.usage = self._usage
        if self._usage is not None:
            exchange.usage_source = "injected" if self._injected else "reported"
        elif self._path.endswith(USAGE_ENDPOINTS) and (exchange.status or 0) < 400:
            exchange.usage_source = "missing"

        if exchange.outcome != "ok":
            return
        if self._stream_error is not None:
            exchange.outcome = "stream_error"
            error = self._stream_error
            message = error.get("message") if isinstance(error, dict) else None
            exchange.error = message if isinstance(message, str) else orjson.dumps(error).decode()
        elif (
            self._sse is not None
            and self._readable
            and not self._done
            and self._path.endswith((*USAGE_ENDPOINTS[:2], "/responses"))
        ):
            exchange.outcome = "upstream_disconnected"
            exchange.error = "stream ended without its final event ([DONE])"

    def _client_has_answer(self) -> bool:
        """The client was sent the whole answer: the stream's final event, or the whole body."""
        if self._final is _Final.DELIVERED:
            return True
        return self._ended_whole and self._client_has_all

    def _problem(self, text: str) -> None:
        if len(self.exchange.parse_errors) < 20:
            self.exchange.parse_errors.append(text)
