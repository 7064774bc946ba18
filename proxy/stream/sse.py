"""Incremental Server-Sent-Events parser: bytes in, events with exact stream offsets out.

The forwarder writes every upstream chunk to the client first and then feeds it here
(`feed`), so the parser sees the stream cut at arbitrary points: inside a line, between the
`\\r` and `\\n` of a CRLF, inside a UTF-8 character. It follows the WHATWG event-stream
interpretation at the byte level and never decodes the data, which stays bytes for the
caller's JSON parser. Besides the fields, each event carries the offsets of its bytes in the
stream (`start`, `end`), and `pending_start` tells where a not-yet-dispatched event begins,
so the forwarder can withhold exactly one event (the usage event it injected) from the client.

No I/O: the caller owns the socket, the parser only keeps the unterminated tail of the stream.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BOM = b"\xef\xbb\xbf"
_EOL = re.compile(rb"\r\n|\r|\n")


@dataclass(slots=True)
class Event:
    """One dispatched event."""

    data: bytes
    """The data lines joined with b"\\n" (without the trailing newline)."""
    event: str | None
    """The last `event:` field of this event, if any."""
    id: str | None
    """The last event id seen in the stream so far (per WHATWG it outlives the event)."""
    start: int
    """Stream offset of the first byte of the event's first field line."""
    end: int
    """Stream offset just past the line terminator of the blank line that dispatched it."""


def one_data_line(event: bytes) -> bytes | None:
    """The data of `event`, whole events from between two events, when it is a single event
    of one `data: ` line (LF line ends), as `SSEParser` gives it; None otherwise (then the
    parser reads it). Such an event needs no parser built and fed."""
    if (
        event.startswith(b"data: ")
        and event.find(b"\n") == len(event) - 2
        and event.endswith(b"\n\n")
        and b"\r" not in event
    ):
        return event[6:-2]
    return None


class SSEParser:
    """Feed it the stream piece by piece; it returns the events each piece completes."""

    __slots__ = ("_bom_done", "_data", "_event", "_id", "_start", "_tail", "_tail_cr", "offset")

    def __init__(self, *, from_start: bool = True) -> None:
        """`from_start`: the bytes fed begin the stream, so a byte order mark may open them;
        otherwise they begin between two events of it."""
        self.offset = 0
        """Bytes fed so far."""
        self._bom_done = not from_start
        # The unterminated last line, kept as the pieces it arrived in so that a long line
        # fed in many small pieces is joined once, not once per piece.
        self._tail: list[bytes] = []
        # The tail ends with `\r`: a complete line unless the next byte is `\n`, which would
        # belong to the same terminator; the line waits for that byte so `end` can include it.
        self._tail_cr = False
        self._data: list[bytes] = []
        self._event: str | None = None
        self._id: str | None = None
        self._start: int | None = None

    @property
    def pending_start(self) -> int | None:
        """Start offset of the event being accumulated (from its first field line, even one
        still arriving), or None when every byte fed so far is settled: part of a dispatched
        event, a comment, a blank line or the BOM."""
        if self._start is not None:
            return self._start
        if self._tail and self._bom_done and self._tail[0][:1] not in (b":", b"\r"):
            return self.offset - sum(map(len, self._tail))
        return None

    @property
    def settled(self) -> bool:
        """Every byte fed so far is settled and no line is partly received."""
        return not self._tail and self._start is None

    def feed(self, data: bytes) -> list[Event]:
        """The events that `data`, the next piece of the stream, completes."""
        if not data:
            return []
        self.offset += len(data)
        if not self._bom_done:
            if self._tail:
                data = self._tail[0] + data
                self._tail = []
            if len(data) < len(_BOM) and _BOM.startswith(data):
                self._tail = [data]
                return []
            self._bom_done = True
            if data.startswith(_BOM):
                data = data[len(_BOM) :]
        elif self._tail:
            if not self._tail_cr and b"\n" not in data and b"\r" not in data:
                self._tail.append(data)
                return []
            self._tail.append(data)
            data = b"".join(self._tail)
            self._tail = []
        return self._lines(data, final=False)

    def flush(self) -> list[Event]:
        """End of stream. Lenient where WHATWG discards: an unterminated last line still
        counts, and an event with data but no closing blank line is still dispatched, so a
        stream cut right after its last data line is recorded whole."""
        data = b"".join(self._tail)
        self._tail = []
        self._tail_cr = False
        self._bom_done = True
        events = self._lines(data, final=True) if data else []
        if self._tail:
            tail = self._tail[0]
            self._tail = []
            self._line(tail, self.offset - len(tail), self.offset, events)
        if self._data:
            self._line(b"", self.offset, self.offset, events)
        self._start = None
        self._data = []
        self._event = None
        return events

    def _lines(self, buf: bytes, *, final: bool) -> list[Event]:
        """Handle every terminated line of `buf`, which ends at the current offset; keep the
        unterminated rest as the tail."""
        events: list[Event] = []
        base = self.offset - len(buf)
        pos = 0
        if b"\r" not in buf:
            # Nearly every line of a token stream is a `data: ` line or the blank line after
            # it: those are read here, the event's state in locals, its value sliced out of
            # the buffer once; `_line` does the rest, with the state handed over.
            start, data, find = self._start, self._data, buf.find
            nl = find(b"\n")
            while nl >= 0:
                if buf.startswith(b"data: ", pos):
                    if start is None:
                        start = base + pos
                    data.append(buf[pos + 6 : nl])
                elif nl == pos and data:
                    assert start is not None
                    value = data[0] if len(data) == 1 else b"\n".join(data)
                    events.append(Event(value, self._event, self._id, start, base + nl + 1))
                    start, data, self._event = None, [], None
                else:
                    self._start, self._data = start, data
                    self._line(buf[pos:nl], base + pos, base + nl + 1, events)
                    start, data = self._start, self._data
                pos = nl + 1
                nl = find(b"\n", pos)
            self._start, self._data = start, data
        else:
            size = len(buf)
            for match in _EOL.finditer(buf):
                eol, after = match.span()
                if after == size and not final and buf[-1] == 0x0D:
                    break
                self._line(buf[pos:eol], base + pos, base + after, events)
                pos = after
        if pos < len(buf):
            rest = buf[pos:]
            self._tail = [rest]
            self._tail_cr = rest[-1] == 0x0D
        else:
            self._tail_cr = False
        return events

    def _line(self, line: bytes, start: int, end: int, events: list[Event]) -> None:
        if line.startswith(b"data:"):
            if self._start is None:
                self._start = start
            self._data.append(line[6:] if line[5:6] == b" " else line[5:])
            return
        if not line:
            if self._data:
                self._dispatch(end, events)
            else:
                self._start = None
                self._event = None
            return
        if line[0] == 0x3A:  # ":" starts a comment, e.g. a keep-alive
            return
        if self._start is None:
            self._start = start
        name, colon, value = line.partition(b":")
        if colon and value[:1] == b" ":
            value = value[1:]
        if name == b"data":
            self._data.append(value)
        elif name == b"event":
            self._event = value.decode("utf-8", "replace")
        elif name == b"id" and b"\0" not in value:
            self._id = value.decode("utf-8", "replace")

    def _dispatch(self, end: int, events: list[Event]) -> None:
        """The blank line ending at `end` completes the event with the data lines gathered."""
        data = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
        assert self._start is not None
        events.append(Event(data, self._event, self._id, self._start, end))
        self._start = None
        self._data = []
        self._event = None
