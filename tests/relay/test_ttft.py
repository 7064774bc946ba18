"""`ttft_ms` is the time to the first generated token of any kind, reasoning included, for
Responses and chat streams alike, with the real openai SDK as the client. The upstream holds
the rest of the stream back until the client has the first reasoning delta, so that delta
reaches the proxy in a piece of its own; the raw pacing says when each piece came."""

from __future__ import annotations

from typing import Any

import orjson

from tests.conftest import FakeUpstream, ProxyFactory, Sdk
from tests.stream.test_responses import FINAL, serve_events, sse, stream_events


def arrival_ms(pacing: Any, events: list[bytes], position: int) -> float:
    """When the proxy had event `position` of a stream written one event a write (pacing:
    the offset after each piece it got, and when, in ms since the request arrived)."""
    end = sum(len(event) for event in events[: position + 1])
    return float(next(ms for offset, ms in pacing if offset >= end))


async def test_ttft_is_the_first_reasoning_token_of_a_responses_stream(
    upstream: FakeUpstream, make_proxy: ProxyFactory, sdk: Sdk
) -> None:
    proxy = await make_proxy(store_raw_stream=True)
    events = stream_events(FINAL)
    first = next(n for n, e in enumerate(events) if e["type"].endswith("summary_text.delta"))
    tool = next(n for n, e in enumerate(events) if e["type"].endswith("arguments.delta"))
    written = [sse(e) for e in events]
    go_on = serve_events(upstream, written, gate=first + 1)
    client = sdk(proxy.base_url, "sk-x", max_retries=0)
    async for event in await client.responses.create(model="o4-mini", input="x", stream=True):
        if event.type == "response.reasoning_summary_text.delta":
            go_on.set()

    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.outcome == "ok" and exchange.ttft_ms is not None
    assert exchange.ttft_ms == arrival_ms(exchange.raw_pacing, written, first)
    assert exchange.ttft_ms < arrival_ms(exchange.raw_pacing, written, tool)


def chat_chunk(**delta: Any) -> bytes:
    chunk = {
        "id": "chatcmpl-r1",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "deepseek-r1",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


async def test_ttft_is_the_first_reasoning_content_of_a_chat_stream(
    upstream: FakeUpstream, make_proxy: ProxyFactory, sdk: Sdk
) -> None:
    """vLLM and DeepSeek stream the reasoning as `reasoning_content` before any content."""
    proxy = await make_proxy(store_raw_stream=True, stream_usage="passthrough")
    written = [
        chat_chunk(role="assistant", content=""),
        chat_chunk(reasoning_content="The user wants", content=None),
        chat_chunk(reasoning_content=" a greeting.", content=None),
        chat_chunk(content="Hello"),
        chat_chunk(content=" 世界"),
        b"data: [DONE]\n\n",
    ]
    go_on = serve_events(upstream, written, gate=2)
    client = sdk(proxy.base_url, "sk-x", max_retries=0)
    stream = await client.chat.completions.create(
        model="deepseek-r1", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    async for chunk in stream:
        if (chunk.choices[0].delta.model_extra or {}).get("reasoning_content"):
            go_on.set()

    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.outcome == "ok" and exchange.ttft_ms is not None
    message = exchange.response_json["choices"][0]["message"]
    assert message["reasoning_content"] == "The user wants a greeting."
    assert exchange.ttft_ms == arrival_ms(exchange.raw_pacing, written, 1)
    assert exchange.ttft_ms < arrival_ms(exchange.raw_pacing, written, 3)
