"""Legacy completions and the Responses API: streamed, the record holds what a non-streaming
call returns, with usage; cut short, it holds the text received so far."""

from __future__ import annotations

import copy
from typing import Any

import orjson
from aiohttp import web

from proxy.stream.completions import CompletionAssembler
from proxy.stream.responses import ResponsesAssembler
from tests.conftest import FakeUpstream, RunningProxy, Sdk

RESPONSE: dict[str, Any] = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1_741_290_958,
    "status": "completed",
    "model": "gpt-4.1-2025-04-14",
    "output": [
        {
            "id": "msg_1",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hi there, wörld 🌍", "annotations": []}],
        }
    ],
    "usage": {
        "input_tokens": 36,
        "input_tokens_details": {"cached_tokens": 12},
        "output_tokens": 87,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 123,
    },
}
TEXT_PIECES = ["Hi", " there", ", wörld", " 🌍"]


def responses_events(final: dict[str, Any], *, complete: bool = True) -> list[dict[str, Any]]:
    """The event sequence the Responses API streams for `final`."""
    started = {**copy.deepcopy(final), "status": "in_progress", "output": [], "usage": None}
    item = final["output"][0]
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "status": "in_progress", "content": []},
        },
        {
            "type": "response.content_part.added",
            "output_index": 0,
            "content_index": 0,
            "item_id": item["id"],
            "part": {"type": "output_text", "text": "", "annotations": []},
        },
    ]
    for piece in TEXT_PIECES:
        events.append(
            {
                "type": "response.output_text.delta",
                "item_id": item["id"],
                "output_index": 0,
                "content_index": 0,
                "delta": piece,
            }
        )
    if complete:
        events.append({"type": "response.output_item.done", "output_index": 0, "item": item})
        events.append({"type": "response.completed", "response": final})
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]


def as_sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    )


def test_responses_assembler_rebuilds_text_of_a_cut_stream() -> None:
    assembler = ResponsesAssembler()
    produced = [assembler.add(e) for e in responses_events(RESPONSE, complete=False)]
    assert produced.count(True) == len(TEXT_PIECES)
    assert not assembler.finished and assembler.usage is None
    assert assembler.output_text() == "".join(TEXT_PIECES)
    partial = assembler.result()
    assert partial is not None and partial["status"] == "in_progress"
    assert partial["output"][0]["content"][0]["text"] == "".join(TEXT_PIECES)

    for event in responses_events(RESPONSE)[-2:]:
        assembler.add(event)
    assert assembler.finished and assembler.result() == RESPONSE
    assert assembler.usage == RESPONSE["usage"]


async def test_responses_api_through_the_proxy(
    upstream: FakeUpstream, proxy: RunningProxy, sdk: Sdk
) -> None:
    async def responses(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.json_response(RESPONSE)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(as_sse(responses_events(RESPONSE)))
        return response

    upstream.override = responses
    client = sdk(proxy.base_url, "sk-x")
    plain = await client.responses.create(model="gpt-4.1", input="hello")
    streamed = [
        e async for e in await client.responses.create(model="gpt-4.1", input="hello", stream=True)
    ]
    assert plain.output_text == "".join(TEXT_PIECES)
    assert streamed[-1].type == "response.completed"

    first, second = await proxy.recorder.wait_for(2)
    for exchange in (first, second):
        assert exchange.outcome == "ok"
        assert exchange.response_json == RESPONSE
        assert exchange.usage == RESPONSE["usage"] and exchange.usage_source == "reported"
        assert exchange.response_model == "gpt-4.1-2025-04-14"
    assert second.stream and second.ttft_ms is not None


async def test_responses_stream_cut_short_is_recorded_with_its_text(
    upstream: FakeUpstream, proxy: RunningProxy, sdk: Sdk
) -> None:
    async def cut(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(as_sse(responses_events(RESPONSE, complete=False)))
        return response

    upstream.override = cut
    client = sdk(proxy.base_url, "sk-x")
    async for _ in await client.responses.create(model="gpt-4.1", input="x", stream=True):
        pass
    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.outcome == "upstream_disconnected"
    assert exchange.response_json["output"][0]["content"][0]["text"] == "".join(TEXT_PIECES)


COMPLETION = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 1_700_000_000,
    "model": "gpt-3.5-turbo-instruct",
    "choices": [
        {
            "text": " world, again",
            "index": 0,
            "logprobs": {
                "tokens": [" world", ",", " again"],
                "token_logprobs": [-0.1, -0.2, -0.3],
                "top_logprobs": [{" world": -0.1}, {",": -0.2}, {" again": -0.3}],
                "text_offset": [5, 11, 12],
            },
            "finish_reason": "length",
        }
    ],
    "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5},
}


def completion_chunks(final: dict[str, Any], include_usage: bool) -> list[dict[str, Any]]:
    choice = final["choices"][0]
    lp = choice["logprobs"]
    chunks = []
    for i, token in enumerate(lp["tokens"]):
        piece = {key: [lp[key][i]] for key in lp}
        last = i == len(lp["tokens"]) - 1
        chunks.append(
            {
                "id": final["id"],
                "object": "text_completion",
                "created": final["created"],
                "model": final["model"],
                "choices": [
                    {
                        "text": token,
                        "index": 0,
                        "logprobs": piece,
                        "finish_reason": choice["finish_reason"] if last else None,
                    }
                ],
            }
        )
    if include_usage:
        chunks.append({**chunks[0], "choices": [], "usage": final["usage"]})
    return chunks


def test_completion_assembler_equals_the_non_streaming_answer() -> None:
    assembler = CompletionAssembler()
    for chunk in completion_chunks(COMPLETION, include_usage=True):
        assembler.add(chunk)
    assert assembler.result() == COMPLETION


async def test_legacy_completions_stream_gets_usage_injected(
    upstream: FakeUpstream, proxy: RunningProxy, sdk: Sdk
) -> None:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        include = (body.get("stream_options") or {}).get("include_usage", False)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for chunk in completion_chunks(COMPLETION, include):
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        return response

    upstream.override = completions
    client = sdk(proxy.base_url, "sk-x")
    chunks = [
        c
        async for c in await client.completions.create(
            model="gpt-3.5-turbo-instruct", prompt="hello", stream=True
        )
    ]
    assert all(c.choices for c in chunks)  # the usage event the proxy asked for is withheld
    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.response_json == COMPLETION
    assert exchange.usage_source == "injected" and exchange.outcome == "ok"
