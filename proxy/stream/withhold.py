"""Cutting the usage event the proxy asked for out of a stream, byte-exact.

When the client did not ask for a stream's usage and the proxy asked for it
(`stream_usage = "inject"`), the client must get the stream it would have got: without the usage
event (`"choices": []` with a usage object) and without the `"usage":null` member the option
adds to every other chunk. Only bytes that may hold that event wait to be parsed; the rest goes
to the client as it comes (`StreamTee`).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from proxy.stream.carry import FinishCarry
from proxy.stream.sse import SSEParser, one_data_line

_KEY = rb'"(?:u|\\u0075)(?:s|\\u0073)(?:a|\\u0061)(?:g|\\u0067)(?:e|\\u0065)"'
"""The usage key, any of its letters perhaps escaped (`"\\u0075sage"`)."""
_ESCAPE = b"\\u00"
"""In every escaped spelling of the key."""
_USAGE_VALUE = re.compile(_KEY + rb"(?:\s*:(?!\s*null)|[ \t]*(?=[\r\n]))")
"""A usage key whose value is not null, the only kind of event the proxy ever withholds, or a
usage key at the end of a line (the JSON going on in a later data line): a match only makes
the event a candidate, which its parse decides."""
_NULL_USAGE = re.compile(
    rb",[ \t]*" + _KEY + rb"[ \t]*:[ \t]*null\b|" + _KEY + rb"[ \t]*:[ \t]*null[ \t]*,[ \t]*"
)
"""A `"usage": null` member however spaced, with the comma that separates it; never across a
line end (JSON split over data lines keeps its lines)."""
_NULL_MEMBER = b',"usage":null'
"""The `"usage":null` member as OpenAI spells it, in every chunk but the usage event."""


def _first_key(events: bytes) -> int:
    """Where the first usage key in `events` may be: 0 when one may be spelled with escapes
    (a one-byte search first, then the four-byte one: docs/performance.md), -1
    when there is none."""
    if b"\\" in events and _ESCAPE in events:
        return 0
    return events.find(b'"usage"')


def holds_usage(piece: bytes) -> bool:
    """Whether `piece` has a usage key whose value is not null."""
    return _USAGE_VALUE.search(piece) is not None


def is_usage_event(chunk: dict[str, Any]) -> bool:
    """Whether a stream chunk (an event's data, parsed) is a usage event: no choices, a usage
    object. The only kind the proxy withholds."""
    return chunk.get("choices") == [] and bool(chunk.get("usage"))


def whole_events(piece: bytes, end: int | None = None) -> int:
    """How many bytes at the start of `piece`, which starts between events, are whole events
    (up to `end`). A blank line ends an event whatever came before it."""
    end = len(piece) if end is None else end
    lf = piece.rfind(b"\n\n", 0, end)
    crlf = piece.rfind(b"\n\r\n", max(lf, 0), end)  # one before `lf` would end earlier
    return max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)


def without_usage_events(events: bytes, cut: list[bytes] | None = None) -> bytes:
    """Whole events, from between events, as the client gets them: without usage events and
    `"usage":null` members. OpenAI's `"usage":null` members go first, so the events are read
    as the client would get them, and the usage keys left are few (nearly always the usage
    event's own): the search for them starts at the first (at the start when a key may be
    spelled with escapes), and only the events holding one are parsed, each alone. `events`
    do not start as a byte order mark might (`may_start_with_bom`). The usage events cut out
    are added to `cut`."""
    events = events.replace(_NULL_MEMBER, b"")
    first = _first_key(events)
    if first < 0:
        return events
    kept: list[bytes] = []
    at = 0
    found = _USAGE_VALUE.search(events, first)
    while found is not None:
        start = whole_events(events, found.start())
        end = _blank_line_after(events, found.end())
        for cut_start, cut_end in _usage_events(events, start, end):
            kept.append(events[at:cut_start])
            at = cut_end
            if cut is not None:
                cut.append(events[cut_start:cut_end])
        found = _USAGE_VALUE.search(events, end)
    if at:
        kept.append(events[at:])
        events = b"".join(kept)
    return _without_other_null_usage(events)


def _blank_line_after(events: bytes, inside: int) -> int:
    """Where the first LF or CRLF blank line after `inside` ends (the end of `events` if
    none does)."""
    lf = events.find(b"\n\n", inside)
    crlf = events.find(b"\n\r\n", inside, lf + 2 if lf >= 0 else len(events))
    if crlf >= 0:
        return crlf + 3
    return lf + 2 if lf >= 0 else len(events)


def _usage_events(events: bytes, start: int, end: int) -> list[tuple[int, int]]:
    """Where the usage events among the whole events `events[start:end]` are."""
    data = one_data_line(events[start:end])
    if data is not None:  # nearly always: the usage event alone, in one line
        return [(start, end)] if holds_usage(data) and _is_usage_event_data(data) else []
    return [
        (start + event.start, start + event.end)
        for event in SSEParser(from_start=False).feed(events[start:end])
        if holds_usage(event.data) and _is_usage_event_data(event.data)
    ]


def may_start_with_bom(piece: bytes) -> bool:
    """Whether `piece` starts with the first byte of a UTF-8 byte order mark; only the stream's
    parser knows whether it is one (at the stream's start) or part of a field name."""
    return piece.startswith(b"\xef")


def _is_usage_event_data(data: bytes) -> bool:
    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(chunk, dict) and is_usage_event(chunk)


def without_null_usage(events: bytes) -> bytes:
    """Whole events with their `"usage":null` members removed. An upstream asked for stream
    usage adds one to every chunk (OpenAI does); a client that did not ask gets the chunks
    as they would have come without the option. A JSON string cannot hold `"usage"` with
    unescaped quotes, so every match is a key."""
    return _without_other_null_usage(events.replace(_NULL_MEMBER, b""))


def _without_other_null_usage(events: bytes) -> bytes:
    """`without_null_usage` once OpenAI's spelling (`_NULL_MEMBER`) is gone."""
    if _first_key(events) >= 0:  # another spelling (or a usage object, which stays)
        events = _NULL_USAGE.sub(b"", events)
    return events


class Withholder:
    """Holds the bytes of the event being received, and drops the events it is told to."""

    def __init__(self) -> None:
        self.carry = FinishCarry()
        self._held = bytearray()
        self._base = 0
        """Stream offset of `_held[0]`."""
        self._skip_lf = False
        """A dropped event ended on CR; an LF right after it belongs to it (CRLF cut in two)."""

    def release(self, piece: bytes, drops: list[tuple[int, int]], safe: int) -> bytes:
        """Take `piece`; returns the bytes up to stream offset `safe` (where the event being
        received starts) without the spans in `drops` and without `"usage":null` members."""
        self._held += piece
        out = bytearray()
        cut: list[bytes] = []
        for start, end in drops:
            out += self._take(start)
            dropped = bytes(self._held[: end - self._base])
            del self._held[: end - self._base]
            self._base = end
            self._skip_lf = dropped.endswith(b"\r")
            cut.append(dropped)
        out += self._take(safe)
        return self.carry.out(without_null_usage(bytes(out)), cut)

    def whole(self, events: bytes) -> bytes:
        """Whole events, from between events, as the client gets them (`without_usage_events`),
        a finish chunk among them carrying what a usage event cut out carried for it."""
        cut: list[bytes] = []
        out = without_usage_events(events, cut)
        return self.carry.out(out, cut)

    def flush(self) -> bytes:
        """The bytes still held for the client: the body has ended."""
        return self.carry.flush()

    def passed(self, upto: int) -> None:
        """The bytes up to stream offset `upto` went to the client another way (whole events,
        `without_usage_events`): none of them is held any longer."""
        del self._held[: upto - self._base]
        self._base = upto
        self._skip_lf = False  # such bytes end with an LF

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
