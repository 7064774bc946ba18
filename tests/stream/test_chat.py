"""The reassembler: one fixture per vendor quirk, and the real OpenAI captures against the
openai SDK's own accumulator."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, cast

import orjson
import pytest
from openai._models import construct_type
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from proxy.stream.chat import ChatAssembler
from proxy.stream.sse import SSEParser
from tests.conftest import CAPTURES, captures

Json = dict[str, Any]
HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "m"}


def chunk(*choices: Json, **top: Any) -> Json:
    return {**HEAD, "choices": list(choices), **top}


def choice(index: int = 0, finish_reason: str | None = None, **delta: Any) -> Json:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def assemble(chunks: list[Json]) -> tuple[Json, list[bool]]:
    assembler = ChatAssembler()
    outputs = [assembler.add(c) for c in chunks]
    return assembler.result(), outputs


def completion(*choices: Json, **top: Any) -> Json:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "m",
        "choices": list(choices),
        **top,
    }


ABSENT: Any = object()
"""A key the stream never carried."""


def answer(index: int = 0, content: Any = None, finish: str | None = "stop", **kw: Any) -> Json:
    """A choice of the record; `refusal` (and `content` given as ABSENT) only where the
    stream carried it, as the record has it."""
    message: Json = {"role": "assistant"}
    if content is not ABSENT:
        message["content"] = content
    if "refusal" in kw:
        message["refusal"] = kw.pop("refusal")
    logprobs = kw.pop("logprobs", None)
    return {
        "index": index,
        "message": {**message, **kw.pop("message", {})},
        "logprobs": logprobs,
        "finish_reason": finish,
        **kw,
    }


def test_plain_text() -> None:
    result, outputs = assemble(
        [
            chunk(choice(role="assistant", content="", refusal=None)),
            chunk(choice(content="Hel")),
            chunk(choice(content="lo")),
            chunk(choice(finish_reason="stop")),
        ]
    )
    assert result == completion(answer(content="Hello", refusal=None))
    assert outputs == [False, True, True, False]


def test_azure_filter_chunks() -> None:
    filters = {"hate": {"filtered": False, "severity": "safe"}}
    azure_filter: Json = {
        "choices": [],
        "created": 0,
        "id": "",
        "model": "",
        "object": "",
        "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": filters}],
    }
    late_filter: Json = {
        "choices": [
            {
                "index": 0,
                "finish_reason": None,
                "delta": {},
                "content_filter_results": {"hate": {"filtered": False, "severity": "low"}},
                "content_filter_offsets": {"start_offset": 0, "end_offset": 2},
            }
        ],
        "created": 0,
        "id": "",
        "model": "",
        "object": "",
    }
    result, outputs = assemble(
        [
            azure_filter,
            {
                **chunk({**choice(role="assistant", content=""), "content_filter_results": {}}),
                "model": "gpt-4o-2024-08-06",
                "system_fingerprint": "fp_az",
            },
            {
                **chunk({**choice(content="Hi"), "content_filter_results": filters}),
                "model": "gpt-4o-2024-08-06",
                "system_fingerprint": None,
            },
            {**chunk(choice(finish_reason="stop")), "model": "gpt-4o-2024-08-06"},
            late_filter,
        ]
    )
    assert result == {
        **completion(
            answer(
                content="Hi",
                content_filter_results={"hate": {"filtered": False, "severity": "low"}},
                content_filter_offsets={"start_offset": 0, "end_offset": 2},
            )
        ),
        "model": "gpt-4o-2024-08-06",
        "prompt_filter_results": [{"prompt_index": 0, "content_filter_results": filters}],
        "system_fingerprint": "fp_az",
    }
    assert outputs == [False, False, True, False, False]


def test_choice_without_delta_and_message_instead_of_delta() -> None:
    result, _ = assemble(
        [
            chunk(choice(role="assistant", content="a"), choice(1, role="assistant")),
            chunk({"index": 0, "finish_reason": "stop"}),
            chunk({"index": 1, "message": {"content": "whole"}, "finish_reason": "length"}),
        ]
    )
    assert result == completion(answer(content="a"), answer(1, content="whole", finish="length"))


def test_obfuscation_is_dropped() -> None:
    result, outputs = assemble(
        [
            chunk(choice(role="assistant", content="", obfuscation="xYz1"), obfuscation="aa"),
            chunk(choice(content="ok", obfuscation="k9"), obfuscation="bbbb"),
            chunk({**choice(finish_reason="stop"), "obfuscation": "c"}),
        ]
    )
    assert result == completion(answer(content="ok"))
    assert outputs == [False, True, False]


def test_missing_id_and_created() -> None:
    bare = {"object": "chat.completion.chunk", "model": "llama3"}
    result, _ = assemble(
        [
            {**bare, "choices": [choice(role="assistant", content="x")]},
            {**bare, "choices": [choice(finish_reason="stop")]},
        ]
    )
    assert result == {
        **completion(answer(content="x")),
        "id": None,
        "created": None,
        "model": "llama3",
    }


def test_ollama_repeats_role_on_every_chunk() -> None:
    head = {**HEAD, "system_fingerprint": "fp_ollama"}
    result, _ = assemble(
        [
            {**head, "choices": [choice(role="assistant", content="The")]},
            {**head, "choices": [choice(role="assistant", content=" sky")]},
            {**head, "choices": [choice(finish_reason="stop", role="assistant", content="")]},
        ]
    )
    assert result == completion(answer(content="The sky"), system_fingerprint="fp_ollama")


def test_vllm_stop_reason_reasoning_and_continuous_usage() -> None:
    def usage(completion_tokens: int) -> Json:
        return {
            "prompt_tokens": 5,
            "completion_tokens": completion_tokens,
            "total_tokens": 5 + completion_tokens,
        }

    def vllm(c: Json, n: int) -> Json:
        c["choices"][0]["stop_reason"] = None
        return {**c, "usage": usage(n)}

    result, outputs = assemble(
        [
            vllm(chunk(choice(role="assistant", content="")), 0),
            vllm(chunk(choice(reasoning_content="Think", content=None)), 1),
            vllm(chunk(choice(reasoning_content="ing.", content=None)), 2),
            vllm(chunk(choice(content="42", reasoning_content=None)), 3),
            {**chunk({**choice(finish_reason="stop"), "stop_reason": 128009}), "usage": usage(3)},
        ]
    )
    assert result == completion(
        answer(content="42", message={"reasoning_content": "Thinking."}, stop_reason=128009),
        usage=usage(3),
    )
    assert outputs == [False, True, True, True, False]


def test_reasoning_field() -> None:
    result, outputs = assemble(
        [chunk(choice(role="assistant", reasoning="a")), chunk(choice(reasoning="b", content="c"))]
    )
    assert result == completion(answer(content="c", finish=None, message={"reasoning": "ab"}))
    assert outputs == [True, True]


def test_llama_cpp_timings() -> None:
    timings = {"prompt_n": 4, "predicted_n": 2, "predicted_per_second": 51.3}
    result, _ = assemble(
        [
            chunk(choice(role="assistant", content="Hi")),
            chunk(choice(finish_reason="stop"), timings=timings),
            chunk(choice(), timings=None),
        ]
    )
    assert result == completion(answer(content="Hi"), timings=timings)


def test_three_choices_interleaved() -> None:
    result, _ = assemble(
        [
            chunk(choice(2, role="assistant", content="c")),
            chunk(choice(0, role="assistant", content="a")),
            chunk(choice(2, content="C"), choice(1, role="assistant", content="b")),
            chunk(choice(1, content="B", finish_reason="length")),
            chunk(choice(0, content="A")),
            chunk(choice(0, finish_reason="stop"), choice(2, finish_reason="stop")),
        ]
    )
    assert result == completion(
        answer(0, content="aA"), answer(1, content="bB", finish="length"), answer(2, content="cC")
    )


def _call(index: int | None = None, **fields: Any) -> Json:
    return fields if index is None else {"index": index, **fields}


def test_parallel_tool_calls() -> None:
    result, outputs = assemble(
        [
            chunk(choice(role="assistant", content=None)),
            chunk(
                choice(
                    tool_calls=[
                        _call(
                            0, id="call_a", type="function", function={"name": "f", "arguments": ""}
                        )
                    ]
                )
            ),
            chunk(
                choice(
                    tool_calls=[
                        _call(
                            1,
                            id="call_b",
                            type="function",
                            function={"name": "g", "arguments": "{"},
                        )
                    ]
                )
            ),
            chunk(choice(tool_calls=[_call(0, function={"arguments": '{"x"'})])),
            # A vendor repeating the name: set once, never appended.
            chunk(choice(tool_calls=[_call(0, function={"name": "f", "arguments": ": 1}"})])),
            chunk(
                choice(
                    tool_calls=[
                        _call(1, function={"arguments": "}"}),
                        _call(1, function={"arguments": ""}),
                    ]
                )
            ),
            chunk(choice(finish_reason="tool_calls")),
        ]
    )
    calls = [
        {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
    ]
    assert result == completion(answer(finish="tool_calls", message={"tool_calls": calls}))
    assert outputs == [False, True, True, True, True, True, False]


def test_tool_calls_without_index() -> None:
    result, _ = assemble(
        [
            chunk(
                choice(
                    role="assistant",
                    tool_calls=[_call(id="c1", function={"name": "f", "arguments": "{"})],
                )
            ),
            chunk(choice(tool_calls=[_call(function={"arguments": "}"})])),
            chunk(choice(tool_calls=[_call(id="c2", type="function", function={"name": "g"})])),
            chunk(choice(tool_calls=[_call(id="c2", function={"arguments": "[]"})])),
            chunk(choice(finish_reason="tool_calls")),
        ]
    )
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "[]"}},
    ]
    assert result == completion(
        answer(content=ABSENT, finish="tool_calls", message={"tool_calls": calls})
    )


def test_tool_calls_reusing_an_index_with_new_ids_are_kept_apart() -> None:
    result, _ = assemble(
        [
            chunk(choice(tool_calls=[_call(0, id="c1", function={"name": "f", "arguments": "1"})])),
            chunk(choice(tool_calls=[_call(0, id="c2", function={"name": "g", "arguments": "2"})])),
            chunk(choice(tool_calls=[_call(0, function={"arguments": "2"})])),
        ]
    )
    calls = [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "1"}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "22"}},
    ]
    assert result == completion(answer(content=ABSENT, finish=None, message={"tool_calls": calls}))


def test_legacy_function_call() -> None:
    result, outputs = assemble(
        [
            chunk(
                choice(role="assistant", content=None, function_call={"name": "f", "arguments": ""})
            ),
            chunk(choice(function_call={"arguments": '{"a":'})),
            chunk(choice(function_call={"arguments": " 1}"})),
            chunk(choice(finish_reason="function_call", function_call=None)),
        ]
    )
    expected = answer(
        finish="function_call", message={"function_call": {"name": "f", "arguments": '{"a": 1}'}}
    )
    assert result == completion(expected)
    assert outputs == [True, True, True, False]


def test_audio() -> None:
    result, outputs = assemble(
        [
            chunk(
                choice(role="assistant", content=None, audio={"id": "audio_1", "transcript": "Hel"})
            ),
            chunk(choice(audio={"data": "UklG"})),
            chunk(choice(audio={"transcript": "lo", "data": "RiQ="})),
            chunk(choice(finish_reason="stop", audio={"expires_at": 1729000000})),
        ]
    )
    audio = {"id": "audio_1", "transcript": "Hello", "data": "UklGRiQ=", "expires_at": 1729000000}
    assert result == completion(answer(message={"audio": audio}))
    assert outputs == [True, True, True, False]


def test_usage_then_null_usage() -> None:
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "total_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "accepted_prediction_tokens": 0},
        "vendor_extra": {"queue_ms": 3},
    }
    assembler = ChatAssembler()
    assembler.add(chunk(choice(role="assistant", content="ok"), usage=None))
    assert assembler.usage is None
    assembler.add(chunk(choice(finish_reason="stop"), usage=None))
    assembler.add(chunk(usage=usage))
    assembler.add(chunk(usage=None))
    assert assembler.usage == usage
    assert assembler.result() == completion(answer(content="ok"), usage=usage)


def test_refusal_with_logprobs() -> None:
    def token(text: str) -> Json:
        return {"token": text, "logprob": -0.5, "bytes": list(text.encode()), "top_logprobs": []}

    def lp(refusal: list[Json] | None, content: list[Json] | None = None) -> Json:
        return {"content": content, "refusal": refusal}

    result, outputs = assemble(
        [
            chunk({**choice(role="assistant", content=None, refusal=""), "logprobs": lp([])}),
            chunk({**choice(refusal="I'm"), "logprobs": lp([token("I'm")])}),
            chunk({**choice(refusal=" sorry"), "logprobs": lp([token(" sorry")])}),
            chunk({**choice(finish_reason="stop"), "logprobs": None}),
        ]
    )
    expected = answer(refusal="I'm sorry", logprobs=lp([token("I'm"), token(" sorry")]))
    assert result == completion(expected)
    assert outputs == [False, True, True, False]


def test_logprobs_null_and_empty_lists_differ() -> None:
    entry = {"token": "a", "logprob": -1.0, "bytes": [97], "top_logprobs": []}
    result, _ = assemble(
        [
            chunk(choice(role="assistant", content="")),
            chunk({**choice(content="a"), "logprobs": {"content": [entry], "refusal": None}}),
            chunk(
                {
                    **choice(1, role="assistant", content=""),
                    "logprobs": {"content": [], "refusal": None},
                }
            ),
            chunk({**choice(1), "logprobs": {"content": None, "refusal": None}}),
        ]
    )
    assert [c["logprobs"] for c in result["choices"]] == [
        {"content": [entry], "refusal": None},
        {"content": [], "refusal": None},
    ]


def test_unknown_keys_follow_the_general_rule() -> None:
    result, _ = assemble(
        [
            chunk(
                {**choice(role="assistant", note="a", tags=["x"], score=1), "extra": "e1"}, top=1
            ),
            chunk({**choice(note="b", tags=["y"], score=None), "extra": None}, top=None),
            chunk({**choice(note=None, tags=None, score=2), "extra": "e2"}, top=3),
        ]
    )
    assert result == completion(
        answer(
            content=ABSENT,
            finish=None,
            message={"note": "ab", "tags": ["x", "y"], "score": 2},
            extra="e2",
        ),
        top=3,
    )


def test_result_is_fresh_and_callable_mid_stream() -> None:
    assembler = ChatAssembler()
    assert assembler.result() == {**completion(), "id": None, "created": None, "model": None}
    assembler.add(chunk(choice(role="assistant", content="a")))
    first = assembler.result()
    first["choices"][0]["message"]["content"] = "mutated"
    assembler.add(chunk(choice(content="b", finish_reason="stop")))
    assert assembler.result() == completion(answer(content="ab"))
    assert assembler.result() == assembler.result()


def test_chunks_are_not_mutated() -> None:
    chunks = [
        chunk(
            {**choice(role="assistant", content="a"), "logprobs": {"content": [], "refusal": None}}
        ),
        chunk({**choice(content="b"), "logprobs": {"content": [{"token": "b"}], "refusal": None}}),
    ]
    before = json.dumps(chunks)
    assemble(chunks)
    assert json.dumps(chunks) == before


# --- real OpenAI streams against the openai SDK -----------------------------------------------


def _events(stream: bytes, rng: random.Random, max_piece: int) -> list[bytes]:
    parser = SSEParser()
    events = []
    pos = 0
    while pos < len(stream):
        size = rng.randint(1, max_piece)
        events += parser.feed(stream[pos : pos + size])
        pos += size
    events += parser.flush()
    return [e.data for e in events]


def _sdk(datas: list[bytes]) -> Json:
    # No input_tools / response_format (they default to `omit`): the SDK must not parse.
    state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
    for data in datas:
        if data == b"[DONE]":
            break
        value = json.loads(data)
        state.handle_chunk(
            cast(ChatCompletionChunk, construct_type(type_=ChatCompletionChunk, value=value))
        )
    # to_dict leaves out what the stream never set, as our result does.
    final: Json = state.get_final_completion().to_dict()
    return final


def _comparable(completion: Json) -> Json:
    """The fields both sides must agree on."""
    choices = []
    for c in completion["choices"]:
        message = c["message"]
        logprobs = c.get("logprobs") or {}
        choices.append(
            {
                "index": c["index"],
                "role": message.get("role"),
                "content": message.get("content"),
                "refusal": message.get("refusal"),
                "tool_calls": [
                    (t["id"], t["type"], t["function"]["name"], t["function"]["arguments"])
                    for t in message.get("tool_calls") or []
                ],
                "finish_reason": c.get("finish_reason"),
                "logprobs": {k: logprobs.get(k) for k in ("content", "refusal")},
            }
        )
    keys = ("id", "model", "created", "system_fingerprint", "usage")
    return {**{k: completion.get(k) for k in keys}, "choices": choices}


@pytest.mark.parametrize("path", captures())
@pytest.mark.parametrize("max_piece", [1, 7, 100, 1 << 20])
def test_captures_match_the_openai_sdk(path: Path, max_piece: int) -> None:
    stream = path.read_bytes()
    datas = _events(stream, random.Random(f"{path.stem}{max_piece}"), max_piece)
    assert datas[-1] == b"[DONE]"
    assembler = ChatAssembler()
    for data in datas[:-1]:
        assembler.add(orjson.loads(data))
    ours = assembler.result()
    sdk = _sdk(datas)
    assert _comparable(ours) == _comparable(sdk)
    assert ours["usage"] == assembler.usage
    assert ours["usage"]["total_tokens"] > 0
    assert all(c["finish_reason"] for c in ours["choices"])


@pytest.mark.skipif(not CAPTURES.is_dir(), reason=f"no captures in {CAPTURES}")
def test_capture_with_three_interleaved_choices() -> None:
    # Independent of the SDK: what the captures README says of this stream.
    stream = (CAPTURES / "a0c4f0be184e.sse").read_bytes()
    assembler = ChatAssembler()
    for data in _events(stream, random.Random(0), 50)[:-1]:
        assembler.add(orjson.loads(data))
    result = assembler.result()
    assert [c["index"] for c in result["choices"]] == [0, 1, 2]
    assert [json.loads(c["message"]["content"])["city"] for c in result["choices"][:2]] == [
        "San Francisco",
        "San Francisco",
    ]
    assert result["choices"][2]["message"]["content"] is None
    assert result["choices"][2]["message"]["refusal"].startswith("I'm sorr")
    assert result["usage"] == {"prompt_tokens": 17, "completion_tokens": 71, "total_tokens": 88}
