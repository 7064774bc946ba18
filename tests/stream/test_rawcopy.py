"""The copy of a stream kept for playback: exact bytes and pacing back, whatever the length,
and a long stream held in far less memory than its bytes."""

from __future__ import annotations

import gzip
import random
import tracemalloc

import orjson
import pytest

from proxy.store.lines import decode
from proxy.stream.rawcopy import PLAIN_LIMIT, RawCopy, compress_whole


def _chunks(count: int, rng: random.Random) -> list[bytes]:
    """SSE events shaped like OpenAI's chat chunks, each a different word."""
    head = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "model": "gpt-4o-mini"}
    events = []
    for i in range(count):
        letters = rng.choices("abcdefghijklmnopqrstuvwxyzé世", k=rng.randint(1, 9))
        word = "".join(letters)
        delta = {"content": f" {word}{i}"}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        events.append(b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n")
    return events


@pytest.mark.parametrize("count", [0, 1, 5, 60, 400])
def test_the_bytes_and_their_pacing_come_back_exactly(count: int) -> None:
    rng = random.Random(count)
    stream = b"".join(_chunks(count, rng)) + b"\r\n\xff"  # bytes need not be text
    copy = RawCopy()
    written, at, ms = [], 0, 0.0
    while at < len(stream):  # writes of any size, as the upstream's pieces come
        size = rng.choice([1, 7, 300, 5000])
        copy.add(stream[at : at + size], ms)
        at = min(at + size, len(stream))
        written.append((at, ms))
        ms += rng.random()
    assert copy.size == len(stream)
    assert gzip.decompress(copy.gzip()) == stream
    assert copy.pacing() == written


def test_a_long_stream_is_held_in_far_less_memory_than_its_bytes() -> None:
    chunks = _chunks(1000, random.Random(1))
    size = sum(map(len, chunks))
    assert size > 10 * PLAIN_LIMIT
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        copy = RawCopy()
        for ms, chunk in enumerate(chunks):
            copy.add(chunk, float(ms))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # The compressor's state (~11 KiB), what it has compressed so far, and the pacing arrays.
    assert held < size / 3, (held, size)
    assert gzip.decompress(copy.gzip()) == b"".join(chunks)


def test_a_stream_spooled_before_copies_were_compressed_still_loads() -> None:
    raw = b'data: {"x":1}\n\ndata: [DONE]\n\n'
    exchange = {"id": "0191f3c2-0000-7000-8000-000000000000", "started_at": 1.5}
    exchange |= {"method": "POST", "path": "/v1/chat/completions", "query": "", "upstream": "o"}
    exchange |= {"raw_stream": "ZGF0YTogeyJ4IjoxfQoKZGF0YTogW0RPTkVdCgo=", "raw_pacing": [[29, 2]]}
    back = decode(orjson.dumps({"v": 1, "exchange": exchange}))
    assert gzip.decompress(back.raw_stream_gz or b"") == raw
    assert back.raw_pacing == [(29, 2)]


@pytest.mark.parametrize("count", [5, 400])
def test_the_copy_ends_once(count: int) -> None:
    chunks = _chunks(count, random.Random(2))
    copy = RawCopy()
    for ms, chunk in enumerate(chunks):
        copy.add(chunk, float(ms))
    first = copy.gzip()
    assert copy.gzip() == first  # asked again, the same bytes
    assert gzip.decompress(first) == b"".join(chunks)
    with pytest.raises(RuntimeError, match="ended"):
        copy.add(b"late", 1.0)


@pytest.mark.parametrize("bits", range(9, 16))
def test_a_whole_copy_is_the_bytes_gzip_makes_with_the_full_window(bits: int) -> None:
    """The window is fitted to the stream's length: a repeat as far back as the stream is long
    is still found, so the bytes are those of the full window, at every size around each
    window's reach (2**bits - 262 bytes)."""
    rng = random.Random(bits)
    reach = (1 << bits) - 262
    for size in (reach - 1, reach, reach + 1, (1 << bits) + 1):
        repeated = rng.randbytes(64)
        data = repeated + rng.randbytes(size - 128) + repeated
        assert compress_whole(data) == gzip.compress(data, compresslevel=1, mtime=0)
    stream = b"".join(_chunks(200, rng))
    assert compress_whole(stream) == gzip.compress(stream, compresslevel=1, mtime=0)
    assert compress_whole(b"") == gzip.compress(b"", compresslevel=1, mtime=0)
