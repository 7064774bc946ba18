"""The SSE parser, byte by byte: every quirk of the wire format, at every split point."""

from __future__ import annotations

import itertools
import random
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.stream.sse import Event, SSEParser, one_data_line
from tests.conftest import captures

# One stream with every quirk: BOM, keep-alive comments, CRLF, bare CR, a multi-byte UTF-8
# payload, several data lines, event/id fields, no space after the colon, a field name
# without a colon, ignored fields, and an id-only event that must not be dispatched.
EMOJI = "h\u00e9llo \u20ac \U0001f600".encode()
STREAM = (
    b"\xef\xbb\xbf"
    b": keep-alive\n"
    b"\n"
    b'data: {"a": "' + EMOJI + b'"}\r\n'
    b"\r\n"
    b": ping\r\n"
    b"event: ping\r"
    b"id: 7\r"
    b"data:no-space\r"
    b"data:  two spaces\r"
    b"\r"
    b"data\n"
    b": a comment inside an event\n"
    b"data: second\n"
    b"retry: 100\n"
    b"unknown: x\n"
    b"\n"
    b"id: only-id\n"
    b"\n"
    b"data: [DONE]\n"
    b"\n"
)
BLOCKS = [
    b'data: {"a": "' + EMOJI + b'"}\r\n\r\n',
    b"event: ping\rid: 7\rdata:no-space\rdata:  two spaces\r\r",
    b"data\n: a comment inside an event\ndata: second\nretry: 100\nunknown: x\n\n",
    b"data: [DONE]\n\n",
]


def _expected() -> list[Event]:
    fields = [
        (b'{"a": "' + EMOJI + b'"}', None, None),
        (b"no-space\n two spaces", "ping", "7"),
        (b"\nsecond", None, "7"),  # the last event id outlives its event (WHATWG)
        (b"[DONE]", None, "only-id"),
    ]
    events = []
    for block, (data, event, id_) in zip(BLOCKS, fields, strict=True):
        start = STREAM.index(block)
        events.append(Event(data, event, id_, start, start + len(block)))
    return events


def parse(pieces: list[bytes], *, flush: bool = True) -> list[Event]:
    parser = SSEParser()
    events = [e for piece in pieces for e in parser.feed(piece)]
    if flush:
        events += parser.flush()
    assert parser.offset == sum(map(len, pieces))
    return events


def test_one_feed() -> None:
    events = parse([STREAM])
    assert events == _expected()
    for event, block in zip(events, BLOCKS, strict=True):
        assert STREAM[event.start : event.end] == block


def test_events_are_dispatched_without_flush() -> None:
    assert parse([STREAM], flush=False) == _expected()


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_every_split_point(cut: int) -> None:
    assert parse([STREAM[:cut], STREAM[cut:]], flush=False) == _expected()


def test_every_pair_of_split_points() -> None:
    expected = _expected()
    for i in range(1, len(STREAM)):
        for j in range(i, len(STREAM)):
            assert parse([STREAM[:i], STREAM[i:j], STREAM[j:]]) == expected, (i, j)


def test_split_points_cover_the_awkward_places() -> None:
    # Guards the two tests above: the stream has a CRLF and a 4-byte UTF-8 character to cut.
    assert b"\r\n" in STREAM
    assert "\U0001f600".encode() in STREAM


def test_byte_by_byte_pending_start() -> None:
    expected = _expected()
    parser = SSEParser()
    seen: list[Event] = []
    # Field lines of the id-only event also count as pending until its blank line.
    id_only = STREAM.index(b"id: only-id")
    spans = [(e.start, e.end) for e in expected] + [(id_only, id_only + len(b"id: only-id\n\n"))]
    for k in range(1, len(STREAM) + 1):
        seen += parser.feed(STREAM[k - 1 : k])
        inside = [start for start, end in spans if start < k < end]
        if inside:
            assert parser.pending_start == inside[0], k
        elif not any(end == k for _, end in spans):
            assert parser.pending_start is None, k
        # A blank line ending in a bare CR waits for the next byte (it could be a CRLF).
        assert all(e.end <= k for e in seen)
    seen += parser.flush()
    assert seen == expected
    assert parser.pending_start is None


def test_crlf_cut_between_cr_and_lf_is_one_terminator() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: x\r") == []
    assert parser.pending_start == 0
    assert parser.feed(b"\n\r") == []
    assert parser.pending_start == 0
    assert parser.feed(b"\ndata: y\r\n\r\n") == [
        Event(b"x", None, None, 0, 11),
        Event(b"y", None, None, 11, 22),
    ]
    assert parser.pending_start is None
    assert parser.flush() == []


def test_bare_cr_at_end_of_feed_then_another_byte() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\r") == []
    # The next byte is not \n: both CRs were terminators on their own.
    assert parser.feed(b"d") == [Event(b"a", None, None, 0, 9)]
    assert parser.pending_start == 9
    assert parser.feed(b"ata: b\r\r") == []
    assert parser.flush() == [Event(b"b", None, None, 9, 18)]


def test_lf_after_lf_is_a_blank_line() -> None:
    assert parse([b"data: a\n", b"\n", b"\n", b"data: b\n\n"]) == [
        Event(b"a", None, None, 0, 9),
        Event(b"b", None, None, 10, 19),
    ]


def test_keep_alive_comments_do_not_start_an_event() -> None:
    parser = SSEParser()
    assert parser.feed(b": keep-alive\n\n: keep") == []
    assert parser.pending_start is None
    assert parser.feed(b"-alive\n\ndata: 1\n\n") == [Event(b"1", None, None, 28, 37)]
    assert parser.pending_start is None


def test_partial_field_line_is_pending() -> None:
    parser = SSEParser()
    parser.feed(b"data: 1\n\nda")
    assert parser.pending_start == 9
    parser.feed(b"ta: {")
    assert parser.pending_start == 9
    assert parser.feed(b"}\n\n") == [Event(b"{}", None, None, 9, 19)]
    assert parser.pending_start is None


def test_several_data_lines_join_with_newline() -> None:
    assert parse([b"data: a\ndata:\ndata: c\n\n"]) == [Event(b"a\n\nc", None, None, 0, 23)]


def test_only_one_space_after_the_colon_is_removed() -> None:
    events = parse([b"data:x\n\ndata: x\n\ndata:  x\n\ndata:\tx\n\n"])
    assert [e.data for e in events] == [b"x", b"x", b" x", b"\tx"]


def test_event_and_id_fields() -> None:
    events = parse([b"event: a\nid: 1\ndata: x\n\ndata: y\n\nid\nevent:b\ndata: z\n\n"])
    assert [(e.event, e.id) for e in events] == [("a", "1"), (None, "1"), ("b", "")]


def test_id_with_nul_is_ignored() -> None:
    events = parse([b"id: 1\ndata: x\n\nid: 2\x003\ndata: y\n\n"])
    assert [e.id for e in events] == ["1", "1"]


def test_event_without_data_is_not_dispatched() -> None:
    parser = SSEParser()
    assert parser.feed(b"event: a\nid: 1\n\n") == []
    assert parser.pending_start is None
    assert parser.feed(b"data: x\n\n") == [Event(b"x", None, "1", 16, 25)]


def test_bom_is_skipped_only_at_stream_start() -> None:
    assert parse([b"\xef\xbb\xbfdata: x\n\n"]) == [Event(b"x", None, None, 3, 12)]
    for cut in (1, 2, 3):
        stream = b"\xef\xbb\xbfdata: x\n\n"
        assert parse([stream[:cut], stream[cut:]]) == [Event(b"x", None, None, 3, 12)]
    # Deferred, it is part of a field name (an unknown field), so this event has no data.
    assert parse([b"data: x\n\n\xef\xbb\xbfdata: y\n\n"]) == [Event(b"x", None, None, 0, 9)]
    # A parser started between two events of a stream reads them as the stream's parser does.
    middle = SSEParser(from_start=False)
    assert middle.feed(b"\xef\xbb\xbfdata: y\n\ndata: z\n\n") == [Event(b"z", None, None, 12, 21)]


def test_partial_bom_is_not_pending() -> None:
    parser = SSEParser()
    parser.feed(b"\xef\xbb")
    assert parser.pending_start is None
    parser.feed(b"\xbfd")
    assert parser.pending_start == 3


def test_flush_dispatches_an_unterminated_stream() -> None:
    assert parse([b"data: 1\n\ndata: 2"]) == [
        Event(b"1", None, None, 0, 9),
        Event(b"2", None, None, 9, 16),
    ]
    assert parse([b"data: 2\n"]) == [Event(b"2", None, None, 0, 8)]
    assert parse([b"data: 2\r"]) == [Event(b"2", None, None, 0, 8)]
    assert parse([b"data: 2\ndata: 3\r\n"]) == [Event(b"2\n3", None, None, 0, 17)]


def test_flush_without_pending_data() -> None:
    assert parse([b"data: 1\n\n: bye"]) == [Event(b"1", None, None, 0, 9)]
    assert parse([b"id: 9\n"]) == []
    assert parse([b""]) == []


def test_empty_feed_is_harmless() -> None:
    parser = SSEParser()
    assert parser.feed(b"") == []
    assert parser.feed(b"data: x\n") == []
    assert parser.feed(b"") == []
    assert parser.feed(b"\n") == [Event(b"x", None, None, 0, 9)]


def test_long_line_in_tiny_pieces() -> None:
    payload = b"x" * 50_000
    stream = b"data: " + payload + b"\n\n"
    pieces = [stream[i : i + 7] for i in range(0, len(stream), 7)]
    assert parse(pieces, flush=False) == [Event(payload, None, None, 0, len(stream))]


# --- against a reference that reads the whole stream at once --------------------------------


def reference(stream: bytes) -> list[Event]:
    """A direct, non-incremental reading of the WHATWG rules (plus the lenient end)."""
    pos = 3 if stream.startswith(b"\xef\xbb\xbf") else 0
    events: list[Event] = []
    data: list[bytes] = []
    event: str | None = None
    last_id: str | None = None
    start: int | None = None
    lines = [
        (m.start(1), m.group(1), m.end())
        for m in re.finditer(rb"([^\r\n]*)(\r\n|\r|\n|$)", stream[pos:])
        if m.end() > m.start() or m.start() < len(stream) - pos
    ]
    for line_start, line, line_end in lines:
        line_start, line_end = line_start + pos, line_end + pos
        if not line:
            if data:
                assert start is not None
                events.append(Event(b"\n".join(data), event, last_id, start, line_end))
            data, event, start = [], None, None
        elif not line.startswith(b":"):
            start = line_start if start is None else start
            name, _, value = line.partition(b":")
            value = value[1:] if value.startswith(b" ") else value
            if name == b"data":
                data.append(value)
            elif name == b"event":
                event = value.decode()
            elif name == b"id" and b"\0" not in value:
                last_id = value.decode()
    if data:
        assert start is not None
        events.append(Event(b"\n".join(data), event, last_id, start, len(stream)))
    return events


_line = st.one_of(
    st.sampled_from([b"", b": keep-alive", b"data", b"data:", b"retry: 5", b"x: y"]),
    st.builds(lambda v: b"data: " + v, st.sampled_from([b"{}", b"[DONE]", EMOJI, b" a"])),
    st.builds(lambda v: b"data:" + v, st.sampled_from([b"1", b"\xc3\xa9"])),
    st.builds(lambda v: b"event: " + v, st.sampled_from([b"delta", b"done"])),
    st.builds(lambda v: b"id: " + v, st.sampled_from([b"1", b"42"])),
)
_eol = st.sampled_from([b"\n", b"\r\n", b"\r"])


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(st.tuples(_line, _eol), max_size=14),
    bom=st.booleans(),
    last=st.sampled_from([b"", b"data: tail", b"data: tail\r"]),
    rng=st.randoms(use_true_random=False),
)
def test_random_streams_match_the_reference(
    lines: list[tuple[bytes, bytes]], bom: bool, last: bytes, rng: random.Random
) -> None:
    stream = (b"\xef\xbb\xbf" if bom else b"") + b"".join(a + b for a, b in lines) + last
    expected = reference(stream)
    cuts = sorted(
        rng.sample(range(1, len(stream)), min(max(len(stream) - 1, 0), rng.randint(0, 8)))
    )
    bounds = [0, *cuts, len(stream)]
    pieces = [stream[a:b] for a, b in itertools.pairwise(bounds)]
    assert parse(pieces) == expected


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.tuples(_line, _eol), max_size=4))
def test_one_data_line_reads_as_the_parser(lines: list[tuple[bytes, bytes]]) -> None:
    """Where `one_data_line` reads an event without the parser, the parser reads the same."""
    event = b"".join(a + b for a, b in lines)
    data = one_data_line(event)
    if data is not None:
        assert SSEParser(from_start=False).feed(event) == [Event(data, None, None, 0, len(event))]


@pytest.mark.parametrize(
    ("event", "data"),
    [
        (b'data: {"usage": {}}\n\n', b'{"usage": {}}'),
        (b"data:  two spaces\n\n", b" two spaces"),
        (b"data: a\r\n\r\n", None),
        (b"data: a\rb\n\n", None),
        (b"data: a\ndata: b\n\n", None),
        (b": ping\ndata: a\n\n", None),
        (b"event: x\ndata: a\n\n", None),
        (b"data: a\n", None),
        (b"data:a\n\n", None),
    ],
)
def test_one_data_line(event: bytes, data: bytes | None) -> None:
    assert one_data_line(event) == data


def test_reference_agrees_on_the_quirk_stream() -> None:
    assert reference(STREAM) == _expected()


# --- real OpenAI streams ---------------------------------------------------------------------


@pytest.mark.parametrize("path", captures())
def test_openai_captures(path: Path) -> None:
    stream = path.read_bytes()
    blocks = [block + b"\n\n" for block in stream.split(b"\n\n") if block]
    rng = random.Random(path.stem)
    for max_piece in (1, 13, 256, len(stream)):
        parser = SSEParser()
        events: list[Event] = []
        pos = 0
        while pos < len(stream):
            size = rng.randint(1, max_piece)
            events += parser.feed(stream[pos : pos + size])
            pos += size
        assert parser.flush() == []
        assert [stream[e.start : e.end] for e in events] == blocks
        assert [b"data: " + e.data + b"\n\n" for e in events] == blocks
        assert events[-1].data == b"[DONE]"
