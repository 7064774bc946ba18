"""What spans say of content: bounded (`otlp_content_max_bytes`), the Responses API as messages
with its instructions, several choices told apart; and the warning about a refused export
says what happens. A real receiver decodes what flightrec posts; the SDK is the client."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest
from aiohttp import web

from proxy.sinks import otlp
from tests.conftest import FakeUpstream, Sdk, completion, serving, until
from tests.sinks.test_otlp import KEY, Receiver, attributes, dropped, proxy_with, receiver

__all__ = ["proxy_with", "receiver"]  # fixtures

BIG = "é" * 200_000  # 400,000 bytes of UTF-8


async def test_content_is_cut_to_otlp_content_max_bytes(
    upstream: FakeUpstream, receiver: Receiver, proxy_with: Any, sdk: Sdk
) -> None:
    base_url, _ = await proxy_with(
        otlp_endpoint=receiver.url, otlp_content=True, otlp_content_max_bytes=1000
    )
    await sdk(base_url, KEY, max_retries=0).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": BIG}]
    )
    await until(lambda: len(receiver.spans) >= 1, within=10)
    found = attributes(receiver.spans[0])["gen_ai.input.messages"]
    text, marker = found.split("…")
    assert len(text.encode()) <= 1000 and text.startswith('[{"role":"user","content":"éé')
    assert marker == "[flightrec: cut to 1000 of 400030 bytes]"


async def test_several_choices_carry_their_index_and_finish_reason(
    upstream: FakeUpstream, receiver: Receiver, proxy_with: Any, sdk: Sdk
) -> None:
    choices = [
        {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
        for i, (text, reason) in enumerate([("Red", "stop"), ("Blu", "length")])
    ]
    upstream.completion = completion(choices=choices)
    base_url, _ = await proxy_with(otlp_endpoint=receiver.url, otlp_content=True)
    await sdk(base_url, KEY, max_retries=0).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "colour"}], n=2
    )
    await until(lambda: len(receiver.spans) >= 1, within=10)
    attrs = attributes(receiver.spans[0])
    assert orjson.loads(attrs["gen_ai.output.messages"]) == [
        {"role": "assistant", "content": "Red", "index": 0, "finish_reason": "stop"},
        {"role": "assistant", "content": "Blu", "index": 1, "finish_reason": "length"},
    ]
    assert attrs["openai.api.type"] == "chat_completions"


RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1_700_000_000,
    "status": "completed",
    "model": "gpt-4.1-2025-04-14",
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Paris.", "annotations": []}],
        }
    ],
    "usage": {"input_tokens": 9, "output_tokens": 2, "total_tokens": 11},
}


async def test_responses_api_spans_give_messages_and_instructions(
    upstream: FakeUpstream, receiver: Receiver, proxy_with: Any, sdk: Sdk
) -> None:
    """The OpenAI conventions: operation `chat`, `openai.api.type` `responses`; the input
    items as messages, `instructions` as `gen_ai.system_instructions`."""

    async def responses(request: web.Request) -> web.Response:
        return web.json_response(RESPONSE)

    upstream.override = responses
    base_url, _ = await proxy_with(otlp_endpoint=receiver.url, otlp_content=True)
    await sdk(base_url, KEY, max_retries=0).responses.create(
        model="gpt-4.1",
        instructions="Answer in one word.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Capital of France?"}]},
            {"type": "function_call", "call_id": "c1", "name": "look", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "Paris"},
        ],
    )
    await until(lambda: len(receiver.spans) >= 1, within=10)
    attrs = attributes(receiver.spans[0])
    assert (attrs["gen_ai.operation.name"], attrs["openai.api.type"]) == ("chat", "responses")
    assert orjson.loads(attrs["gen_ai.system_instructions"]) == [
        {"type": "text", "content": "Answer in one word."}
    ]
    assert orjson.loads(attrs["gen_ai.input.messages"]) == [
        {"role": "user", "content": "Capital of France?"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "look", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "Paris"},
    ]
    assert orjson.loads(attrs["gen_ai.output.messages"]) == [
        {"role": "assistant", "content": "Paris.", "finish_reason": "stop"}
    ]


async def test_the_warning_about_a_refused_export_is_true(
    upstream: FakeUpstream,
    proxy_with: Any,
    sdk: Sdk,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A collector that refuses one export (413, too large) and takes the next: the warning
    says that batch was dropped and when the exporter tries again, not that it drops spans
    until the collector takes them (the next export is delivered)."""
    monkeypatch.setattr(otlp, "INTERVAL", 0.05)
    monkeypatch.setattr(otlp, "RETRY_MIN", 0.2)
    posts: list[int] = []

    async def traces(request: web.Request) -> web.Response:
        await request.read()
        posts.append(413 if not posts else 200)
        return web.Response(status=posts[-1], content_type="application/x-protobuf")

    async with serving("/v1/traces", traces) as root:
        base_url, metrics = await proxy_with(otlp_endpoint=root + "/v1/traces")
        client = sdk(base_url, KEY, max_retries=0)
        with caplog.at_level(logging.WARNING, logger="proxy.sinks.otlp"):
            await client.chat.completions.create(model="gpt-4o-mini", messages=[])
            await until(lambda: dropped(metrics) == 1, within=10)
            await asyncio.sleep(0.3)  # past the rest after the refusal
            await client.chat.completions.create(model="gpt-4o-mini", messages=[])
            await until(lambda: posts == [413, 200], within=10)
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "proxy.sinks.otlp"]
    assert "until it does" not in warning
    assert "did not take 1 spans (HTTP 413): dropped, with the spans of exchanges that end " in (
        warning
    )
    assert warning.endswith("s; then it is tried again")
