"""The Responses API through the proxy, with the real openai SDK as the client and an upstream
whose events follow the SDK's own types (`openai/types/responses/*_event.py`): a stream cut
mid function call or mid reasoning summary keeps what was received, a terminal event without
`output` gets its items rebuilt as `get_final_response()` rebuilds them."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web

from proxy.stream.responses import ResponsesAssembler
from tests.conftest import FakeUpstream, RunningProxy, Sdk

Json = dict[str, Any]

REASONING: Json = {
    "id": "rs_1",
    "type": "reasoning",
    "summary": [
        {"type": "summary_text", "text": "**Weather** — the user wants Paris, Île-de-France."},
        {"type": "summary_text", "text": "Call get_weather with the city 🌦."},
    ],
}
CALL = {
    "id": "fc_1",
    "type": "function_call",
    "status": "completed",
    "arguments": '{"city":"Paris, Île-de-France","unit":"°C"}',
    "call_id": "call_1",
    "name": "get_weather",
}
MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "status": "completed",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "It is 21 °C in Paris 🌞.", "annotations": []}],
}
FINAL: Json = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1_741_290_958,
    "status": "completed",
    "model": "o4-mini-2025-04-16",
    "output": [REASONING, CALL, MESSAGE],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "usage": {
        "input_tokens": 50,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 120,
        "output_tokens_details": {"reasoning_tokens": 64},
        "total_tokens": 170,
    },
}


def pieces(text: str, size: int = 5) -> list[str]:
    return [text[at : at + size] for at in range(0, len(text), size)]


def _item_events(index: int, item: Json) -> list[Json]:
    """The events that stream one output item, from `output_item.added` to `.done`."""
    at: Json = {"item_id": item["id"], "output_index": index}
    if item["type"] == "message":
        events: list[Json] = [{**at, "type": "response.output_item.added"}]
        events[0]["item"] = {**item, "status": "in_progress", "content": []}
        for n, part in enumerate(item["content"]):
            here = {**at, "content_index": n}
            empty = {**part, "text": ""}
            events.append({**here, "type": "response.content_part.added", "part": empty})
            for piece in pieces(part["text"]):
                events.append({**here, "type": "response.output_text.delta", "delta": piece})
            events.append({**here, "type": "response.output_text.done", "text": part["text"]})
            events.append({**here, "type": "response.content_part.done", "part": part})
    elif item["type"] == "function_call":
        added = {**item, "status": "in_progress", "arguments": ""}
        events = [{**at, "type": "response.output_item.added", "item": added}]
        for piece in pieces(item["arguments"]):
            events.append({**at, "type": "response.function_call_arguments.delta", "delta": piece})
        done = {**at, "type": "response.function_call_arguments.done"}
        events.append({**done, "arguments": item["arguments"]})
    else:
        added = {**item, "summary": []}
        events = [{**at, "type": "response.output_item.added", "item": added}]
        for n, part in enumerate(item["summary"]):
            here = {**at, "summary_index": n}
            empty = {**part, "text": ""}
            events.append({**here, "type": "response.reasoning_summary_part.added", "part": empty})
            for piece in pieces(part["text"]):
                delta = {**here, "type": "response.reasoning_summary_text.delta", "delta": piece}
                events.append(delta)
            text = {**here, "type": "response.reasoning_summary_text.done", "text": part["text"]}
            events.append(text)
            events.append({**here, "type": "response.reasoning_summary_part.done", "part": part})
    events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    return events


def stream_events(final: Json, terminal: Json | None = None) -> list[Json]:
    """The whole stream for `final`; `terminal` is the response its last event carries."""
    started = {**copy.deepcopy(final), "status": "in_progress", "output": [], "usage": None}
    events: list[Json] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    for index, item in enumerate(final["output"]):
        events += _item_events(index, item)
    events.append(
        {"type": "response.completed", "response": final if terminal is None else terminal}
    )
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]


def sse(event: Json) -> bytes:
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def serve_events(
    upstream: FakeUpstream, events: list[bytes], *, cut: bool = False, gate: int | None = None
) -> asyncio.Event:
    """Have the upstream stream SSE `events`, one write each; `cut`: then drop the connection
    without ending the body. With `gate`, events from that position on wait for the returned
    asyncio event to be set."""
    go_on = asyncio.Event()

    async def handle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for n, event in enumerate(events):
            if n == gate:
                await asyncio.wait_for(go_on.wait(), 10)
            await response.write(event)
        if cut:
            assert request.transport is not None
            request.transport.close()
            return response
        await response.write_eof()
        return response

    upstream.override = handle
    return go_on


async def received_until_cut(
    client: openai.AsyncOpenAI, wanted: Callable[[Any], str | None]
) -> tuple[str, bool]:
    """Stream a response with the SDK, joining the deltas `wanted` picks; and whether the
    stream broke (the proxy passes a cut on as a cut)."""
    got = []
    try:
        async for event in await client.responses.create(model="o4-mini", input="x", stream=True):
            text = wanted(event)
            if text is not None:
                got.append(text)
    except openai.APIError:
        return "".join(got), True
    return "".join(got), False


async def test_a_stream_cut_mid_function_call_keeps_the_arguments_received(
    upstream: FakeUpstream, proxy: RunningProxy, sdk: Sdk
) -> None:
    events = stream_events(FINAL)
    last = max(n for n, e in enumerate(events) if e["type"].endswith("arguments.delta"))
    serve_events(upstream, [sse(e) for e in events[: last - 2]], cut=True)

    def arguments(event: Any) -> str | None:
        return event.delta if event.type == "response.function_call_arguments.delta" else None

    received, broke = await received_until_cut(
        sdk(proxy.base_url, "sk-x", max_retries=0), arguments
    )
    assert broke and received.startswith('{"city":"Paris, Île-de') and received != CALL["arguments"]

    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.outcome == "upstream_disconnected"
    reasoning, call = exchange.response_json["output"]
    assert reasoning == REASONING  # finished before the cut: recorded whole
    assert call == {**CALL, "status": "in_progress", "arguments": received}


async def test_a_stream_cut_mid_reasoning_summary_keeps_the_summary(
    upstream: FakeUpstream, proxy: RunningProxy, sdk: Sdk
) -> None:
    events = stream_events(FINAL)
    second = [n for n, e in enumerate(events) if e.get("summary_index") == 1]
    serve_events(upstream, [sse(e) for e in events[: second[3]]], cut=True)

    def summary(event: Any) -> str | None:
        if event.type == "response.reasoning_summary_text.delta" and event.summary_index == 1:
            return str(event.delta)
        return None

    received, broke = await received_until_cut(sdk(proxy.base_url, "sk-x", max_retries=0), summary)
    assert broke and received and received != REASONING["summary"][1]["text"]

    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.outcome == "upstream_disconnected"
    [item] = exchange.response_json["output"]
    assert item == {
        **REASONING,
        "summary": [REASONING["summary"][0], {"type": "summary_text", "text": received}],
    }


@pytest.mark.parametrize("output", ["absent", "empty"])
async def test_a_completed_event_without_output_is_rebuilt_from_the_finished_items(
    upstream: FakeUpstream, proxy: RunningProxy, sdk: Sdk, output: str
) -> None:
    terminal = {k: v for k, v in FINAL.items() if k != "output"}
    if output == "empty":  # some gateways send []
        terminal["output"] = []
    serve_events(upstream, [sse(e) for e in stream_events(FINAL, terminal)])
    client = sdk(proxy.base_url, "sk-x", max_retries=0)
    async with client.responses.stream(model="o4-mini", input="x") as stream:
        final = await stream.get_final_response()

    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.outcome == "ok" and exchange.usage == FINAL["usage"]
    assert exchange.response_json == FINAL
    if output == "absent":  # the SDK rebuilds it only then: the record is what it gave
        ids = [item.id for item in final.output]  # type: ignore[union-attr]
        assert ids == [item["id"] for item in FINAL["output"]]
        assert final.output[1].arguments == CALL["arguments"]  # type: ignore[union-attr]
        assert final.output_text == MESSAGE["content"][0]["text"]  # type: ignore[index]


def test_strings_without_their_added_events_still_land_in_their_items() -> None:
    """Refusal, reasoning text and custom tool input deltas, with no `added` events at all."""
    assembler = ResponsesAssembler()
    events: list[Json] = [
        {"type": "response.refusal.delta", "output_index": 0, "content_index": 0, "delta": "No"},
        {"type": "response.refusal.delta", "output_index": 0, "content_index": 0, "delta": "pe"},
        {"type": "response.reasoning_text.delta", "output_index": 1, "content_index": 0},
        {"type": "response.custom_tool_call_input.delta", "output_index": 2, "delta": "ls -"},
        {"type": "response.custom_tool_call_input.done", "output_index": 2, "input": "ls -la"},
    ]
    events[2]["delta"] = "Hmm."
    assert [assembler.add(e) for e in events] == [True, True, True, True, False]
    named = {"type": "custom_tool_call", "name": "shell", "input": ""}
    added = {"type": "response.output_item.added", "output_index": 3}
    assert assembler.add({**added, "item": {"type": "message", "content": []}}) is False
    assert assembler.add({**added, "output_index": 4, "item": named}) is True
    assert assembler.result() == {
        "object": "response",
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "refusal", "refusal": "Nope"}],
            },
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "Hmm."}]},
            {"type": "custom_tool_call", "input": "ls -la"},
            {"type": "message", "content": []},
            named,
        ],
    }


def test_an_incomplete_response_without_output_keeps_what_streamed() -> None:
    """As the SDK fills a `response.incomplete` / `.failed` without output: finished items
    whole, the item cut off by the limit with what it had."""
    events = stream_events(FINAL)
    cut = next(n for n, e in enumerate(events) if e["type"] == "response.output_text.done")
    incomplete = {**{k: v for k, v in FINAL.items() if k != "output"}, "status": "incomplete"}
    assembler = ResponsesAssembler()
    for event in [*events[:cut], {"type": "response.incomplete", "response": incomplete}]:
        assembler.add(event)
    assert assembler.finished and assembler.usage == FINAL["usage"]
    reasoning, call, message = assembler.result()["output"]  # type: ignore[index]
    assert (reasoning, call) == (REASONING, CALL)
    assert message == {**MESSAGE, "status": "in_progress"}
