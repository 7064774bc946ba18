"""The response on its way to the client, and the record's look at it.

`StreamTee` has two calls for the relay loop: `relay(piece)` sends a piece of the upstream's
body to the client and has it read for the record; `end(whole=...)` says the body ended. Which
bytes go out, and when the record looks at them, is decided here:

- Normally a piece goes to the client as it came, and `BodyReader` (`reader.py`) reads it a
  moment later (through `Deferred`): the kernel wakes the reader of a local socket on the writer's
  CPU, so work done straight after a write delays the client reading it. Once the body has
  ended, what still waits is read by `finish`, with the rest of the record's work; a piece
  that ends the body (nearly every non-streamed answer, and a short stream that came in one
  piece) is left to `finish` at once, with no timer of its own: a timer here would fire inside
  the client's next exchange.
- When the proxy asked for stream usage itself, the usage event must not reach the client
  (`withhold.py`): the whole events of a piece go out at once, a usage event among them cut out
  by parsing that event alone (the record reads them all a moment later, as above); an event
  not all received yet is read first, and only the bytes before it go out. A finish chunk waits
  for the bytes after it, in case a usage event cut out carries members for it (`carry.py`).

`finish()` fills the exchange once the response is over (`record.conclude`).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Awaitable, Callable

import aiohttp

from proxy.exchange import Exchange
from proxy.relay.deferred import Deferred
from proxy.stream.rawcopy import RawCopy
from proxy.stream.reader import BodyReader, BodySettings
from proxy.stream.withhold import Withholder, may_start_with_bom, whole_events

log = logging.getLogger(__name__)

Write = Callable[[bytes], Awaitable[None]]
"""Writes bytes to the client (`web.StreamResponse.write`)."""
_GONE = (ConnectionResetError, aiohttp.ClientConnectionResetError)


class _Final(enum.Enum):
    """Where a stream's final event is, for the client."""

    NOT_SEEN = enum.auto()
    UNSENT = enum.auto()
    """In bytes held back until now, that are being written."""
    DELIVERED = enum.auto()
    LOST = enum.auto()
    """Arrived after the client had gone."""


class StreamTee:
    def __init__(
        self,
        exchange: Exchange | Callable[[], Exchange],
        write: Write,
        settings: BodySettings,
        *,
        later: Deferred | None = None,
    ) -> None:
        self._exchange = exchange if isinstance(exchange, Exchange) else None
        self._make_exchange = exchange
        """The record, or what makes it: it is made once the first piece is on its way
        (`record.Record`)."""
        self._write = write
        self._settings = settings
        self._reader: BodyReader | None = None
        """Made on first use: after the first piece went to the client."""
        self._withholder = Withholder() if settings.withhold else None
        self._is_sse = settings.sse
        self._started = settings.started
        self._later = later
        self._waiting: list[tuple[bytes, float, bool, bytes | None]] = []
        """Pieces not read yet: when each arrived, whether it went to the client then, and
        what went when that was not the piece itself."""
        self._end_waits = False
        """`end` left the end of the body to `finish`."""
        self._ended_at = 0.0
        self._raw: RawCopy | None = None
        """The bytes the client received and when (for playback)."""
        self._keep_raw = settings.keep_raw and settings.sse
        self._final = _Final.NOT_SEEN
        self._client_here = True
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

    async def relay(self, piece: bytes, *, last: bool = False) -> bool:
        """Send the next piece of the upstream's body to the client (all of it, or what may go
        now) and have it read; False once the client has gone. `last`: the upstream's body has
        ended with this piece."""
        if self._withholder is None:
            self._read_later(piece, await self._send(piece), None, last=last)
            return self._client_here
        ahead = self._whole_events(piece)
        if ahead:
            head, piece = piece[:ahead], piece[ahead:]
            out = self._withholder.whole(head)
            self._read_later(head, await self._send(out), out, last=last and not piece)
        if piece:
            # An event not all here yet, which may be the usage event: read it now; only the
            # bytes before it may go.
            out = self._read_now(piece)
            # Even b"": headers held for a first piece go out now.
            if await self._send(out):
                self._delivered_now(out)
        return self._client_here

    async def end(self, *, whole: bool) -> None:
        """The upstream's body has ended (`whole`: normally, not cut or abandoned) or broken.
        Bytes still held back go to the client; the rest of the reading is left to `finish`,
        off the way of the body's end, unless bytes are held."""
        self._ended_at = time.perf_counter()
        self._ended_whole = whole
        if self._withholder is None:
            self._end_waits = True
            return
        if self._between_events():
            self._end_waits = True
            rest = self._withholder.flush()
        else:
            self._catch_up()
            rest = self._end_body(None) + self._withholder.flush()
        if rest and await self._send(rest):
            self._delivered_now(rest)

    def finish(self) -> None:
        """Fill the exchange from what went by. Called once the client has the whole response:
        building the record must not delay the end of the body."""
        reader = self._reader or self._reader_made()
        self._catch_up()
        if self._end_waits:
            self._end_waits = False
            self._end_body(self._client_has_all)
        exchange = self._exchange or self.exchange
        if exchange.outcome == "client_disconnected" and self._client_has_answer():
            # The client left after it had the whole answer (the openai SDK closes the
            # response at [DONE], without waiting for the body's end): nothing was lost.
            exchange.report("ok")
        reader.finish()
        if self._raw is not None:
            exchange.raw_stream_gz = self._raw.gzip()
            exchange.raw_pacing = self._raw.pacing()

    def passes(self, piece: bytes) -> bool:
        """Whether all of `piece` may go to the client before it is read although an event is
        being withheld (`_whole_events`)."""
        return len(piece) > 0 and self._whole_events(piece) == len(piece)

    def _whole_events(self, piece: bytes) -> int:
        """How many bytes at the start of `piece` may go to the client before they are read
        although an event is being withheld: whole events, from between events, a usage event
        among them cut out by parsing that event alone. So neither the first byte of a stream
        nor the end of one that came in a single piece waits for the events to be read."""
        if may_start_with_bom(piece) or not self._between_events():
            return 0
        return whole_events(piece)

    async def _send(self, data: bytes) -> bool:
        """Write to the client; False once it has gone."""
        if not self._client_here:
            return False
        try:
            await self._write(data)
            return True
        except _GONE:
            self._gone()
            return False

    def _gone(self) -> None:
        self._client_here = False
        self.exchange.report("client_disconnected", "client disconnected")

    def _between_events(self) -> bool:
        """Every byte so far belongs to a whole event (or a comment or a blank line)."""
        if self._waiting:  # (asked only when withholding) waiting pieces all passed: they end so
            return True
        reader = self._reader
        if reader is None:  # nothing read yet
            return self._is_sse
        return reader.sse is not None and reader.sse.settled

    def _reader_made(self) -> BodyReader:
        reader = self._reader
        if reader is None:
            reader = self._reader = BodyReader(self.exchange, self._settings)
        return reader

    def _read_later(
        self, piece: bytes, delivered: bool, written: bytes | None, *, last: bool = False
    ) -> None:
        """Read `piece` a moment from now (with `later`; at once without); `delivered`: it was
        written to the client just now, as it came or as `written`. `last`: the body ends with
        it, so `finish` reads it and no moment of its own is booked."""
        now = time.perf_counter()
        self._client_has_all = delivered
        if self._later is None:
            self._read(piece, now, delivered, written)
            return
        if not self._waiting and not last:
            self._later.add(self._catch_up_later)
        self._waiting.append((piece, now, delivered, written))

    def _catch_up_later(self) -> None:
        """Read the pieces waiting, unless the body has ended: `finish` reads them then, with
        the rest of the record's work, rather than at a moment of their own."""
        if not self._end_waits:
            self._catch_up()

    def _read_now(self, piece: bytes) -> bytes:
        """Read the next piece now; returns the bytes the client may have."""
        self._catch_up()
        self._client_has_all = False  # until `_delivered_now` says the bytes released went out
        return self._read(piece, time.perf_counter(), None)

    def _catch_up(self) -> None:
        """Read the pieces waiting, in order."""
        if not self._waiting:
            return
        waiting, self._waiting = self._waiting, []
        try:
            for piece, arrived, delivered, written in waiting:
                self._read(piece, arrived, delivered, written)
        except Exception as exc:  # a bug: the client has the bytes, the record says what broke
            log.exception("exchange %s: reading the body failed", self.exchange.id)
            self._reader_made().readable = False
            exchange = self.exchange
            if exchange.outcome == "ok":
                exchange.report(
                    "proxy_error", f"reading the body failed: {type(exc).__name__}: {exc}"
                )

    def _read(
        self, piece: bytes, arrived: float, delivered: bool | None, written: bytes | None = None
    ) -> bytes:
        """Read `piece`; `delivered`: it was written to the client, as `written` if that is
        given (None: the caller writes what this returns and says so with `_delivered_now`)."""
        if delivered:
            self._delivered(piece if written is None else written, arrived)
        reader = self._reader or self._reader_made()
        drops = reader.feed(piece, arrived)
        if reader.ended and self._final is _Final.NOT_SEEN:
            self._final_event(reader, delivered)
        if drops is None or self._withholder is None:
            return piece
        if delivered is not None:  # whole events, cut and written already: nothing to release
            self._withholder.passed(reader.settled)
            return piece
        return self._withholder.release(piece, drops, reader.settled)

    def _delivered_now(self, data: bytes) -> None:
        """`data`, bytes held back until now, has been written to the client just now."""
        self._catch_up()
        self._client_has_all = True
        if self._final is _Final.UNSENT:
            self._final = _Final.DELIVERED
        self._delivered(data, time.perf_counter())

    def _delivered(self, data: bytes, when: float) -> None:
        if not data:
            return
        (self._exchange or self.exchange).response_bytes += len(data)
        reader = self._reader
        if self._keep_raw and not (reader is not None and reader.truncated):
            if self._raw is None:
                self._raw = RawCopy()
            self._raw.add(data, (when - self._started) * 1000)

    def _end_body(self, delivered: bool | None) -> bytes:
        """Read what is left of the body; returns bytes still held. `delivered`: as for
        `_read`, of the body's last bytes."""
        reader = self._reader or self._reader_made()
        drops = reader.end(self._ended_at)
        if reader.ended and self._final is _Final.NOT_SEEN:
            self._final_event(reader, delivered)
        if drops is None or self._withholder is None:
            return b""
        return self._withholder.release(b"", drops, reader.sse.offset if reader.sse else 0)

    def _final_event(self, reader: BodyReader, delivered: bool | None) -> None:
        """Note where the stream's final event went, the first time it has been read."""
        if self._final is not _Final.NOT_SEEN or not reader.ended:
            return
        if delivered is None:
            self._final = _Final.UNSENT
        else:
            self._final = _Final.DELIVERED if delivered else _Final.LOST

    def _client_has_answer(self) -> bool:
        """The client was sent the whole answer: the stream's final event, or the whole body."""
        if self._final is _Final.DELIVERED:
            return True
        return self._ended_whole and self._client_has_all
