"""What a withheld usage event carried for the finish chunk before it.

A server asked for stream usage may move members from its finish chunk to the usage event:
llama.cpp's `llama-server` puts `timings` on the last chunk it sends, the finish chunk when
usage was not asked, the usage event when it was. The client that did not ask must get the
finish chunk it would have got, so while the proxy withholds usage events (`withhold.py`),
the finish chunk going to the client waits until the next bytes are known; a usage event cut
out in the meantime gives it the members that are neither the usage event's own shape
(`USAGE_SHAPE`) nor already on the finish chunk, as the upstream spelled them, after its last
member. OpenAI's usage event carries no such member: its clients get the same bytes, the
finish chunk at most one event later.
"""

from __future__ import annotations

import re

import orjson

from proxy.stream.sse import SSEParser, one_data_line

USAGE_SHAPE = frozenset(
    {"id", "object", "created", "model", "system_fingerprint", "choices", "usage", "obfuscation"}
)
"""A usage event's own members: never moved to the finish chunk."""
_FINISHED = re.compile(rb'"finish_reason"\s*:\s*"')
"""A choice that has finished: the only events that may wait."""
_ONE_LINE = re.compile(rb"data: ?(\{[^\r\n]*\})\r?\n\r?\n\Z")
"""An event of one data line holding a JSON object: the only kind given members."""
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_SPACE = b" \t\r\n"


class FinishCarry:
    """Holds a finish chunk on its way to the client until the bytes after it are known."""

    def __init__(self) -> None:
        self._held = b""

    def out(self, data: bytes, cut: list[bytes] | None = None) -> bytes:
        """The bytes to send now, for `data` (whole events, as the client gets them) and the
        usage events `cut` from among or right after them."""
        data = self._held + data if self._held else data
        self._held = b""
        if not _FINISHED.search(data):
            return data
        if cut:
            data = _with_members(data, cut)
        start = _last_event(data)
        if _is_finish(data[start:]):
            self._held = data[start:]
            return data[:start]
        return data

    def flush(self) -> bytes:
        """The bytes still held: the body has ended."""
        held, self._held = self._held, b""
        return held


def _last_event(data: bytes) -> int:
    """Where the last event in `data` (whole events) starts."""
    end = len(data) - 1
    lf = data.rfind(b"\n\n", 0, end)
    crlf = data.rfind(b"\n\r\n", max(lf, 0), end)
    return max(lf + 2 if lf >= 0 else 0, crlf + 3 if crlf >= 0 else 0)


def _chunk(event: bytes) -> tuple[re.Match[bytes], dict[str, object]] | None:
    """An event of one data line and its JSON object."""
    found = _ONE_LINE.search(event)
    if found is None:
        return None
    try:
        chunk = orjson.loads(found.group(1))
    except orjson.JSONDecodeError:
        return None
    return (found, chunk) if isinstance(chunk, dict) else None


def _is_finish(event: bytes) -> bool:
    if b'"finish_reason"' not in event and b"\\" not in event:  # e.g. `data: [DONE]`
        return False  # the key is in no event without it, spelled plainly or with escapes
    parsed = _chunk(event)
    if parsed is None:
        return False
    choices = parsed[1].get("choices")
    return isinstance(choices, list) and any(
        isinstance(c, dict) and c.get("finish_reason") is not None for c in choices
    )


def _with_members(data: bytes, cut: list[bytes]) -> bytes:
    """`data` with the members of the usage events `cut` that its last finish chunk lacks."""
    carried = [usage_data for usage_event in cut for usage_data in _carrying(usage_event)]
    if not carried:  # OpenAI's: its events are not read again, nor walked byte by byte
        return data
    events = SSEParser(from_start=False).feed(data)
    finish = next((e for e in reversed(events) if _is_finish(data[e.start : e.end])), None)
    if finish is None:
        return data
    event = data[finish.start : finish.end]
    parsed = _chunk(event)
    assert parsed is not None
    found, chunk = parsed
    added = b""
    for usage_data in carried:
        for key, value in _members(usage_data):
            name = orjson.loads(key)
            if name not in USAGE_SHAPE and name not in chunk:
                chunk[name] = None
                added += b"," + key + b":" + value
    if not added:
        return data
    at = finish.start + found.end(1) - 1  # before the object's closing brace
    return data[:at] + added + data[at:]


def _carrying(usage_event: bytes) -> list[bytes]:
    """The data of the events in `usage_event` (a usage event cut out) that hold a member
    besides the usage event's own shape: the only ones with something for a finish chunk."""
    one = one_data_line(usage_event)
    if one is not None:
        datas = [one]
    else:
        datas = [event.data for event in SSEParser(from_start=False).feed(usage_event)]
    carrying = []
    for data in datas:
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if isinstance(chunk, dict) and not USAGE_SHAPE.issuperset(chunk):
            carrying.append(data)
    return carrying


def _members(data: bytes) -> list[tuple[bytes, bytes]]:
    """The members of a JSON object's text, each key and value as spelled; [] if `data` is
    not a JSON object."""
    try:
        if not isinstance(orjson.loads(data), dict):
            return []
    except orjson.JSONDecodeError:
        return []
    members: list[tuple[bytes, bytes]] = []
    at = _skip(data, _skip(data, 0) + 1)
    while data[at : at + 1] == b'"':
        key = _STRING.match(data, at)
        assert key is not None
        start = _skip(data, _skip(data, key.end()) + 1)  # past the colon
        end = _value_end(data, start)
        members.append((key.group(), data[start:end]))
        at = _skip(data, end)
        if data[at : at + 1] == b",":
            at = _skip(data, at + 1)
    return members


def _skip(data: bytes, at: int) -> int:
    while at < len(data) and data[at] in _SPACE:
        at += 1
    return at


def _value_end(data: bytes, at: int) -> int:
    """Where the JSON value starting at `at` ends (valid JSON)."""
    depth = 0
    while at < len(data):
        byte = data[at : at + 1]
        if byte == b'"':
            string = _STRING.match(data, at)
            assert string is not None
            at = string.end()
            if depth == 0:
                return at
            continue
        if byte in (b"{", b"["):
            depth += 1
        elif byte in (b"}", b"]"):
            if depth == 0:
                return at
            depth -= 1
            if depth == 0:
                return at + 1
        elif depth == 0 and (byte == b"," or byte in (b" ", b"\t", b"\r", b"\n")):
            return at
        at += 1
    return at
