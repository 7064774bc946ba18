"""Withholding, over streams of every shape cut at every place: the client gets exactly the
stream without the usage-only events and `"usage":null` members, told apart by an independent
reading of the whole stream, and the record is the one the stream read byte by byte makes."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import re
import time
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.exchange import Exchange
from proxy.relay.deferred import Deferred
from proxy.relay.tee import StreamTee
from proxy.stream.endpoints import endpoint
from proxy.stream.reader import BodySettings
from proxy.stream.sse import SSEParser
from proxy.stream.withhold import without_null_usage

_TEXT = st.sampled_from(["Hi", "", 'say "usage": {"a":1}', ',"usage":null', "é😀", "a\nb"])
_SPELL = [
    orjson.dumps,
    lambda obj: json.dumps(obj).encode(),
    lambda obj: json.dumps(obj, separators=(",", " : ")).encode(),
    # the key with escaped letters (text holding `"usage"` has its quotes escaped: untouched)
    lambda obj: orjson.dumps(obj).replace(b'"usage"', b'"\\u0075s\\u0061ge"'),
]
_USAGE = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}


@st.composite
def _data(draw: st.DrawFn) -> bytes:
    """One event's data: content, a usage-only event, or something that looks like one."""
    text = draw(_TEXT)
    shapes: list[Any] = [
        {"id": "c", "choices": [{"index": 0, "delta": {"content": text}}], "usage": None},
        {"usage": None, "id": "c", "choices": [{"index": 0, "delta": {"content": text}}]},
        {"id": "c", "choices": [], "usage": _USAGE},
        # a finish chunk waits for the bytes after it (`carry.py`); nothing moves onto it here
        {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": None},
        {"id": "c", "choices": [{"index": 0, "delta": {"content": text}}], "usage": _USAGE},
        {"id": "c", "choices": [], "usage": {}},
        {"choices": [], "usage": 5},
        {"usage": _USAGE},
        b'"usage": 1',
        b'{"choices":[],"usage":{"t":1},}',
        b'[{"choices":[],"usage":{"t":1}}]',
        orjson.dumps('{"choices":[],"usage":{"t":1}}'),
        b"[DONE]",
    ]
    shape = draw(st.sampled_from(shapes))
    return shape if isinstance(shape, bytes) else draw(st.sampled_from(_SPELL))(shape)


@st.composite
def _event(draw: st.DrawFn, eol: st.SearchStrategy[bytes]) -> bytes:
    """An event: its data on one line or split after a `{`, a `[` or a usage key, comments
    and other fields among its lines, each line ended as `eol` draws, then a blank line."""
    data = draw(_data())
    # JSON may break over data lines there, and between a key and its colon
    splits = [i + 1 for i, byte in enumerate(data) if byte in b"{["]
    splits += [key.end() for key in re.finditer(rb'"(?:usage|\\u0075s\\u0061ge)"', data)]
    cuts = sorted(set(draw(st.lists(st.sampled_from(splits), max_size=2)))) if splits else []
    bounds = [0, *cuts, len(data)]
    lines = [
        draw(st.sampled_from([b"data: ", b"data:"])) + data[a:b]
        for a, b in itertools.pairwise(bounds)
    ]
    extras = [b": ping", b': "usage": {"x":1}', b"event: message", b"id: 7", b"retry: 10"]
    for extra in draw(st.lists(st.sampled_from(extras), max_size=2)):
        lines.insert(draw(st.integers(0, len(lines))), extra)
    return b"".join(line + draw(eol) for line in lines) + draw(eol)


@st.composite
def _stream(draw: st.DrawFn) -> bytes:
    mixed = st.sampled_from([b"\n", b"\n", b"\r\n", b"\r"])
    eol = mixed if draw(st.booleans()) else st.just(b"\n")
    events = draw(st.lists(_event(eol), min_size=1, max_size=6))
    # A byte order mark opens a stream; anywhere else it is part of a field's name.
    marked = draw(st.lists(st.booleans(), min_size=len(events), max_size=len(events)))
    bom = b"\xef\xbb\xbf"
    stream = b"".join(
        bom + event if mark else event for event, mark in zip(events, marked, strict=True)
    )
    if draw(st.booleans()):
        stream += b"data: [DONE]\n\n"
    return stream


@st.composite
def _pieces(draw: st.DrawFn, stream: bytes) -> list[bytes]:
    """All at once, cut between events, or cut anywhere."""
    how = draw(st.sampled_from(["one", "events", "anywhere", "anywhere"]))
    if how == "one" or len(stream) < 2:
        return [stream]
    if how == "events":
        ends = [i + 2 for i in range(len(stream) - 2) if stream[i : i + 2] == b"\n\n"]
        cuts = sorted({end for end in ends if draw(st.booleans())})
    else:
        cuts = sorted(set(draw(st.lists(st.integers(1, len(stream) - 1), max_size=12))))
    bounds = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


def _expected(stream: bytes) -> bytes:
    """The stream read whole, on its own: usage-only events' spans out, then null usage."""
    parser = SSEParser()
    out = bytearray()
    at = 0
    for event in parser.feed(stream) + parser.flush():
        try:
            chunk = orjson.loads(event.data)
        except orjson.JSONDecodeError:
            continue
        if isinstance(chunk, dict) and chunk.get("choices") == [] and chunk.get("usage"):
            out += stream[at : event.start]
            at = event.end
    return without_null_usage(bytes(out + stream[at:]))


class _Client:
    def __init__(self) -> None:
        self.received = bytearray()

    async def write(self, data: bytes) -> None:
        self.received += data


async def _relay(pieces: list[bytes], deferred: bool, flushes: set[int]) -> tuple[bytes, Exchange]:
    """The client's bytes and the record; `deferred`: pieces read a moment later (`Deferred`),
    with the timer's turns at `flushes`."""
    client = _Client()
    later = Deferred(delay=60) if deferred else None
    settings = BodySettings(
        endpoint("/v1/chat/completions"),
        "",
        sse=True,
        injected=True,
        withhold=True,
        started=time.perf_counter(),
        max_record_bytes=1 << 20,
        keep_raw=True,
    )
    tee = StreamTee(
        Exchange.start("POST", "/v1/chat/completions", "", "openai"),
        client.write,
        settings,
        later=later,
    )
    for index, piece in enumerate(pieces):
        await tee.relay(piece)
        if later is not None and index in flushes:
            later.flush()  # what its timer does, between two pieces
    await tee.end(whole=True)
    tee.finish()
    return bytes(client.received), tee.exchange


def _record(exchange: Exchange) -> tuple[Any, ...]:
    response = orjson.dumps(exchange.response_json, option=orjson.OPT_SORT_KEYS)
    return (exchange.chunks, exchange.usage, exchange.outcome, response)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_client_gets_the_stream_as_without_the_option(data: st.DataObject) -> None:
    stream = data.draw(_stream())
    pieces = data.draw(_pieces(stream))
    deferred = data.draw(st.booleans())
    flushes = set(data.draw(st.lists(st.integers(0, len(pieces)), max_size=3)))
    received, exchange = asyncio.run(_relay(pieces, deferred, flushes))
    assert received == _expected(stream)
    assert exchange.response_bytes == len(received)
    assert gzip.decompress(exchange.raw_stream_gz or gzip.compress(b"")) == received
    one_byte_pieces = [stream[i : i + 1] for i in range(len(stream))]
    byte_by_byte, alone = asyncio.run(_relay(one_byte_pieces, False, set()))
    assert byte_by_byte == received
    assert _record(exchange) == _record(alone)
