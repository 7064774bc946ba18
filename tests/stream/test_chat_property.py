"""Property: any completion, streamed any which way, reassembles to exactly itself."""

from __future__ import annotations

import random
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.stream.chat import ChatAssembler
from proxy.stream.sse import SSEParser
from tests.streamgen import chunks_to_sse, completion_to_chunks, completions, cut_bytes

Json = dict[str, Any]


def _expected(completion: Json, include_usage: bool) -> Json:
    return completion if include_usage else {k: v for k, v in completion.items() if k != "usage"}


@settings(max_examples=250, deadline=None)
@given(completion=completions(), include_usage=st.booleans(), rng=st.randoms(use_true_random=False))
def test_chunks_reassemble_to_the_original(
    completion: Json, include_usage: bool, rng: random.Random
) -> None:
    chunks = completion_to_chunks(completion, include_usage=include_usage, rng=rng)
    assembler = ChatAssembler()
    for chunk in chunks:
        assembler.add(chunk)
    assert assembler.result() == _expected(completion, include_usage)
    assert assembler.usage == (completion["usage"] if include_usage else None)


@settings(max_examples=150, deadline=None)
@given(completion=completions(), include_usage=st.booleans(), rng=st.randoms(use_true_random=False))
def test_sse_bytes_cut_anywhere_reassemble_to_the_original(
    completion: Json, include_usage: bool, rng: random.Random
) -> None:
    chunks = completion_to_chunks(completion, include_usage=include_usage, rng=rng)
    stream = chunks_to_sse(chunks)
    parser = SSEParser()
    assembler = ChatAssembler()
    datas = []
    for piece in cut_bytes(stream, rng, max_piece=rng.choice([1, 3, 40, 500])):
        for event in parser.feed(piece):
            datas.append(event.data)
            if event.data != b"[DONE]":
                assembler.add(orjson.loads(event.data))
    assert parser.flush() == []
    assert datas[-1] == b"[DONE]"
    assert len(datas) == len(chunks) + 1
    assert assembler.result() == _expected(completion, include_usage)


@settings(max_examples=100, deadline=None)
@given(completion=completions(), rng=st.randoms(use_true_random=False))
def test_add_reports_generated_output(completion: Json, rng: random.Random) -> None:
    chunks = completion_to_chunks(completion, include_usage=True, rng=rng)
    assembler = ChatAssembler()
    flags = [assembler.add(chunk) for chunk in chunks]

    def has_text(chunk: Json) -> bool:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            calls = delta.get("tool_calls") or []
            if delta.get("content") or delta.get("refusal"):
                return True
            if any(c["function"].get("name") or c["function"].get("arguments") for c in calls):
                return True
        return False

    assert flags == [has_text(chunk) for chunk in chunks]


@settings(max_examples=50, deadline=None)
@given(completion=completions(), rng=st.randoms(use_true_random=False))
def test_partial_stream_is_a_prefix(completion: Json, rng: random.Random) -> None:
    chunks = completion_to_chunks(completion, include_usage=False, rng=rng)
    cut = rng.randint(0, len(chunks))
    assembler = ChatAssembler()
    for chunk in chunks[:cut]:
        assembler.add(chunk)
    partial = assembler.result()
    for mine in partial["choices"]:
        full = completion["choices"][mine["index"]]
        for key in ("content", "refusal"):
            text = mine["message"].get(key)
            assert text is None or full["message"][key].startswith(text)
