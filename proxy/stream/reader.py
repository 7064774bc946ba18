"""Reading a response body for the record: decompress, parse, reassemble, fill the exchange.

`BodyReader` is the part of the tee that looks at bytes the client has (or is about to get): it
never writes to the client and does no I/O. A stream is parsed event by event (`sse.py`) and
folded by its endpoint's assembler (`endpoints.py`); any other body is kept up to
`max_record_bytes` and parsed as JSON at the end. A Batch API file's content is also read line
by line as it passes, whatever its size (`batchfile.py`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from proxy.exchange import Exchange
from proxy.stream.endpoints import Endpoint
from proxy.stream.sse import Event, SSEParser
from proxy.stream.withhold import holds_usage, is_usage_event

READABLE = ("", "identity", "gzip", "x-gzip", "deflate")
"""Content-Encodings the record can decode."""


@dataclass(slots=True)  # not frozen: a frozen dataclass sets each field through object.__setattr__
class BodySettings:
    """How one response body is read for the record: what it is, and the record's bounds."""

    endpoint: Endpoint
    encoding: str
    """The body's Content-Encoding, lower-cased (`""` or `identity`: none)."""
    sse: bool
    """The body is an event stream (`text/event-stream`)."""
    injected: bool
    """The proxy asked the upstream for stream usage itself."""
    withhold: bool
    """The usage event the proxy asked for is kept from the client."""
    started: float
    """`time.perf_counter()` when the request arrived (time to first token counts from it)."""
    max_record_bytes: int = 16 * 1024 * 1024
    """Bytes of a non-stream body the record keeps."""
    max_stream_record_bytes: int = 16 * 1024 * 1024
    """Bytes of a stream the record is made from; past them only what the record cannot do
    without is read (`_past_the_bound`)."""
    keep_raw: bool = False
    """Keep a stream's exact bytes and pacing (`store_raw_stream`)."""
    lines: Callable[[Exchange], LineReader] | None = None
    """Makes a reader of the body's lines, fed alongside (a Batch API file download)."""


class LineReader(Protocol):
    """Reads a body's lines as the body passes (`batchfile.ResultLines`)."""

    def feed(self, data: bytes) -> None: ...

    def end(self) -> None: ...


class Decoder:
    """Incremental gzip/deflate decompression of a body, for the record."""

    def __init__(self, encoding: str) -> None:
        self._encoding = encoding
        self._z: Any = None

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


def _past_the_bound(chunk: dict[str, Any]) -> dict[str, Any]:
    """What the record takes from an event past `max_stream_record_bytes`: its usage, error
    and type, and a Responses snapshot without its output (which repeats the whole stream)."""
    kept: dict[str, Any] = {key: chunk[key] for key in ("type", "usage", "error") if key in chunk}
    response = chunk.get("response")
    if isinstance(response, dict):
        kept["response"] = {key: value for key, value in response.items() if key != "output"}
    return kept


class BodyReader:
    def __init__(
        self,
        exchange: Exchange,
        settings: BodySettings,
    ) -> None:
        self._exchange = exchange
        endpoint = self._endpoint = settings.endpoint
        encoding, sse = settings.encoding, settings.sse
        lines = settings.lines
        self._lines = None if lines is None or sse else lines(exchange)
        self._withhold = settings.withhold
        self._injected = settings.injected
        self._started = settings.started
        self._max = settings.max_record_bytes
        self._max_stream = settings.max_stream_record_bytes
        self._stream_bytes = 0
        self.truncated = False
        """The stream is past `max_stream_record_bytes`."""
        self._events_past = 0
        """Events that came past `_max_stream` and were not recorded."""
        self.readable = encoding in READABLE
        compressed = self.readable and encoding not in ("", "identity")
        self._decoder = Decoder(encoding) if compressed else None
        if not self.readable:
            self._problem(
                f"response Content-Encoding {encoding!r} cannot be decoded for the record"
            )
        self.sse = SSEParser() if sse else None
        make = endpoint.assembler
        self._assembler = make() if sse and make is not None else None
        self._body = bytearray()
        self._body_full = False
        self._events: list[Any] = []
        """A stream no assembler knows: its events as they came."""
        self.ended = False
        """The stream's final event came (`[DONE]` or a terminal event of its endpoint)."""
        self._stream_error: Any = None
        self._usage: dict[str, Any] | None = None

    def feed(self, piece: bytes, arrived: float) -> list[tuple[int, int]] | None:
        """Read the next piece of the body; returns the spans of the stream to withhold, or None
        when nothing can be (the body is not a readable stream)."""
        data = piece
        if self._decoder is not None:
            try:
                data = self._decoder.feed(piece)
            except zlib.error as exc:
                self._problem(f"response body could not be decompressed: {exc}")
                self._decoder = None
                self.readable = False
        if not self.readable:
            return None
        if self.sse is None:
            self._capture(data)
            if self._lines is not None:
                self._lines.feed(data)
            return None
        self._stream_bytes += len(data)
        if self._stream_bytes > self._max_stream:
            self.truncated = True
        return self._on_events(self.sse.feed(data), arrived)

    @property
    def settled(self) -> int:
        """Stream offset up to which every byte belongs to a whole event."""
        assert self.sse is not None
        start = self.sse.pending_start
        return self.sse.offset if start is None else start

    def end(self, ended_at: float) -> list[tuple[int, int]] | None:
        """The body has ended: read what is left of it (its events came at `ended_at`); returns
        the spans to withhold, as `feed` does."""
        if self.readable and self._decoder is not None:
            try:
                tail = self._decoder.flush()
            except zlib.error as exc:
                self._problem(f"response body could not be decompressed: {exc}")
                tail = b""
            if self.sse is None:
                self._capture(tail)
                if self._lines is not None:
                    self._lines.feed(tail)
            elif tail:
                self._on_events(self.sse.feed(tail), ended_at)
        if self.sse is not None and self.readable:
            return self._on_events(self.sse.flush(), ended_at)
        if self._lines is not None and self.readable:
            self._lines.end()
        return None

    def _on_events(self, events: list[Event], arrived: float) -> list[tuple[int, int]]:
        """Record `events`; returns the spans to withhold."""
        drops: list[tuple[int, int]] = []
        exchange = self._exchange
        ends = self._endpoint.ends
        truncated, withhold, assembler = self.truncated, self._withhold, self._assembler
        for event in events:
            exchange.chunks += 1
            data = event.data
            if data == b"[DONE]":
                self.ended = True
                continue
            if truncated and not self._read_past_the_bound(event):
                self._events_past += 1
                continue
            try:  # (a loop per event of every stream: no call of its own)
                chunk = orjson.loads(data)
            except orjson.JSONDecodeError:
                self._problem(f"event {exchange.chunks}: data is not JSON: {data[:120]!r}")
                continue
            if type(chunk) is not dict:
                self._problem(f"event {exchange.chunks}: data is not a JSON object")
                continue
            kind = chunk.get("type")
            if chunk.get("error") is not None or kind == "error":
                self._stream_error = chunk.get("error") or chunk
            if kind in ends:
                self.ended = True
            if withhold and is_usage_event(chunk):  # the withholder's own rule
                drops.append((event.start, event.end))
            if truncated:
                self._events_past += 1
                chunk = _past_the_bound(chunk)
            if assembler is None:
                self._keep_event(chunk, arrived)
                continue
            try:  # the first output is the first token
                produced = assembler.add(chunk)
            except (AttributeError, TypeError, ValueError) as exc:
                # A chunk of an unexpected shape is the upstream's problem, never the
                # client's: it was relayed already; the record notes it and goes on.
                self._problem(f"event {exchange.chunks}: unexpected chunk shape: {exc}")
                continue
            if produced and exchange.ttft_ms is None:
                exchange.ttft_ms = (arrived - self._started) * 1000
        return drops

    def _read_past_the_bound(self, event: Event) -> bool:
        """Whether an event past `max_stream_record_bytes` is parsed: one that may carry usage,
        an error or the end of the stream, told by its bytes (content chunks are not)."""
        data = event.data
        return event.event in self._endpoint.ends or holds_usage(data) or b'"error"' in data

    def _keep_event(self, chunk: dict[str, Any], arrived: float) -> None:
        """Keep an event of a stream no assembler knows as it came; the first is the first
        token."""
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        if not self.truncated:
            self._events.append(chunk)
        exchange = self._exchange
        if exchange.ttft_ms is None:
            exchange.ttft_ms = (arrived - self._started) * 1000

    def _capture(self, data: bytes) -> None:
        if self._body_full or not data:
            return
        if len(self._body) + len(data) > self._max:
            self._body_full = True
            self._problem("response body larger than max_record_bytes: not recorded")
            return
        self._body += data

    def finish(self) -> None:
        """Fill the exchange from what was read: the answer, its usage, how the stream ended."""
        exchange = self._exchange
        result = self._result()
        exchange.response_json = result
        if self.truncated:
            exchange.parse_errors.append(
                f"stream truncated in the record: it is larger than max_stream_record_bytes "
                f"({self._max_stream}); {self._events_past} later events not recorded "
                f"(their usage, errors and the final event were read)"
            )
        if isinstance(result, dict):
            if self.sse is None and isinstance(result.get("usage"), dict):
                self._usage = result["usage"]
            model = result.get("model")
            exchange.response_model = model if isinstance(model, str) else None
            fingerprint = result.get("system_fingerprint")
            exchange.system_fingerprint = fingerprint if isinstance(fingerprint, str) else None
        exchange.usage = self._usage
        if self._usage is not None:
            exchange.usage_source = "injected" if self._injected else "reported"
        elif self._endpoint.usage and (exchange.status or 0) < 400:
            exchange.usage_source = "missing"
        if exchange.outcome == "ok":
            self._stream_outcome()

    def _result(self) -> Any:
        """The answer as the record keeps it: reassembled, as events, or the body's JSON."""
        if self._assembler is not None:
            self._usage = self._assembler.usage
            self._stream_error = self._stream_error or self._assembler.error
            return self._assembler.result()
        if self.sse is not None:
            return self._events
        if not self._body or self._body_full:
            return None
        exchange = self._exchange
        exchange.response_body = bytes(self._body)
        if "json" in (exchange.content_type or ""):
            try:
                return orjson.loads(self._body)
            except orjson.JSONDecodeError:
                self._problem("response body is not valid JSON")
        return None

    def _stream_outcome(self) -> None:
        """A stream that reported an error, or was cut before its final event, did not end ok."""
        exchange = self._exchange
        if self._stream_error is not None:
            error = self._stream_error
            message = error.get("message") if isinstance(error, dict) else None
            text = message if isinstance(message, str) else orjson.dumps(error).decode()
            exchange.report("stream_error", text)
        elif self.sse is not None and self.readable and not self.ended and self._endpoint.ends:
            exchange.report(
                "upstream_disconnected", "stream ended without its final event ([DONE])"
            )

    def _problem(self, text: str) -> None:
        if len(self._exchange.parse_errors) < 20:
            self._exchange.parse_errors.append(text)
