"""llama.cpp's servers through the proxy: the client gets what it would have got directly, and
the record keeps what the stream said, nothing it did not (shapes: tests/llama_shapes.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.exchange import Exchange
from proxy.store import create_engine, detail, upgrade
from tests import dbs
from tests import llama_shapes as llama
from tests.conftest import FakeUpstream, ProxyFactory, Sdk


def _as_llama_server(upstream: FakeUpstream, piece_size: int | str | None) -> None:
    """The fake upstream answers streamed chat completions as llama-server does."""
    upstream.piece_size = piece_size if isinstance(piece_size, int) else None
    upstream.by_event = piece_size == "event"

    async def answer(request: web.Request) -> web.StreamResponse:
        payload = orjson.loads(await request.read())
        asked = bool((payload.get("stream_options") or {}).get("include_usage"))
        return await upstream._write(request, llama.chat_stream(asked), "text/event-stream")

    upstream.override = answer


async def _post_raw(url: str, body: dict[str, Any]) -> bytes:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        assert response.status == 200
        return await response.read()


_CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "stream": True}


@pytest.mark.parametrize("piece_size", [None, 1, 5, 64, "event"])
async def test_llama_server_timings_reach_the_client_where_they_would_have_been(
    upstream: FakeUpstream, make_proxy: ProxyFactory, piece_size: int | str | None
) -> None:
    """Asked for usage, llama-server moves `timings` from the finish chunk to the usage event
    (`to_json_oaicompat_chat_stream`); the proxy asked, withholds that event, and gives the
    finish chunk its `timings` back: the client's bytes are llama-server's un-asked bytes,
    while the record has the usage the proxy asked for."""
    _as_llama_server(upstream, piece_size)
    proxy = await make_proxy()
    received = await _post_raw(proxy.base_url + "/chat/completions", _CHAT)
    sent = orjson.loads(upstream.seen[-1].body)
    assert sent["stream_options"] == {"include_usage": True}
    assert received.count(b'"timings"') == 1
    assert received == llama.chat_stream(include_usage=False)
    await proxy.recorder.wait_for(1)
    exchange = proxy.recorder.exchanges[-1]
    assert exchange.response_json is not None
    assert exchange.response_json["usage"] == llama.USAGE
    assert exchange.response_json["timings"] == llama.TIMINGS


async def test_llama_server_timings_on_the_sdks_last_chunk(
    upstream: FakeUpstream, make_proxy: ProxyFactory, sdk: Sdk
) -> None:
    _as_llama_server(upstream, "event")
    proxy = await make_proxy()
    client = sdk(proxy.base_url, "sk-test")
    stream = await client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[-1].model_extra == {"timings": llama.TIMINGS}
    assert all(chunk.usage is None for chunk in chunks)


def _answering(upstream: FakeUpstream, body: bytes) -> None:
    async def answer(request: web.Request) -> web.StreamResponse:
        return await upstream._write(request, body, "text/event-stream")

    upstream.override = answer


async def _record(upstream: FakeUpstream, make_proxy: ProxyFactory, body: bytes) -> Any:
    _answering(upstream, body)
    proxy = await make_proxy()
    received = await _post_raw(proxy.base_url + "/chat/completions", _CHAT)
    assert received == body
    await proxy.recorder.wait_for(1)
    return proxy.recorder.exchanges[-1].response_json


async def test_llama_server_record_has_no_key_the_stream_never_had(
    upstream: FakeUpstream, make_proxy: ProxyFactory
) -> None:
    """llama-server's deltas carry no `refusal`, its choices no `logprobs` (not asked), and
    `content` is null then text: the record says the same, no `refusal: null`, no
    `logprobs: null`."""
    _as_llama_server(upstream, None)
    proxy = await make_proxy()
    await _post_raw(proxy.base_url + "/chat/completions", _CHAT)
    (exchange,) = await proxy.recorder.wait_for(1)
    record = exchange.response_json
    assert record["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hi there!"},
            "finish_reason": "length",
        }
    ]
    assert record["timings"] == llama.TIMINGS


async def test_llama_server_logprobs_record_has_no_refusal_list(
    upstream: FakeUpstream, make_proxy: ProxyFactory
) -> None:
    record = await _record(upstream, make_proxy, llama.chat_stream_with_logprobs())
    (choice,) = record["choices"]
    assert choice["logprobs"] == {"content": llama.COMPLETION_TOKENS}
    assert choice["message"] == {"role": "assistant", "content": "Hi there"}


async def test_llama_cpp_python_record_keeps_null_logprobs_and_no_refusal(
    upstream: FakeUpstream, make_proxy: ProxyFactory
) -> None:
    """llama-cpp-python's choices say `logprobs: null` (kept), its deltas never `refusal`."""
    record = await _record(upstream, make_proxy, llama.python_chat_stream())
    assert record["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hi"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]


async def _completion_logprobs(url: str, exchange: Exchange) -> dict[str, Any]:
    await dbs.store(url, [exchange])
    engine = create_engine(url)
    try:
        return await detail.logprobs(engine, exchange.id)
    finally:
        await engine.dispose()


async def test_llama_server_completion_logprobs_are_recorded_and_reach_the_table(
    upstream: FakeUpstream, make_proxy: ProxyFactory, tmp_path: Path
) -> None:
    """llama-server streams `/v1/completions` with chat-style logprobs
    (`server_task_result_cmpl_partial::to_json_oaicompat`: `{"content": [{id, token, bytes,
    logprob, top_logprobs}]}`): the record keeps them as they came, and the `logprobs` table
    (the console's heatmap, `GET /api/exchanges/{id}/logprobs`) has one row a token."""
    _answering(upstream, llama.completion_stream())
    proxy = await make_proxy()
    body = {"prompt": "Say", "max_tokens": 2, "logprobs": 2, "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(proxy.base_url + "/completions", json=body) as response,
    ):
        assert await response.read() == llama.completion_stream()
    (exchange,) = await proxy.recorder.wait_for(1)
    (choice,) = exchange.response_json["choices"]
    assert choice["text"] == "Hi there"
    assert choice["logprobs"] == {"content": llama.COMPLETION_TOKENS}
    await upgrade(dbs.sqlite_url(tmp_path / "f.db"))
    found = await _completion_logprobs(dbs.sqlite_url(tmp_path / "f.db"), exchange)
    (shown,) = found["choices"]
    assert (shown["index"], shown["kind"]) == (0, "content")
    assert [(t["token"], t["logprob"]) for t in shown["tokens"]] == [
        ("Hi", -0.25),
        (" there", -0.75),
    ]
    assert shown["tokens"][1]["top_logprobs"][1]["token"] == " all"


async def test_openai_legacy_completion_logprobs_reach_the_table(tmp_path: Path) -> None:
    """OpenAI's legacy lists (`tokens`, `token_logprobs`, `top_logprobs` as `{token:
    logprob}`) become one row a token, the top alternatives as chat-style entries."""
    response = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "gpt-3.5-turbo-instruct",
        "choices": [
            {
                "text": " world",
                "index": 0,
                "logprobs": {
                    "tokens": [" wor", "ld"],
                    "token_logprobs": [-0.5, -0.125],
                    "top_logprobs": [{" wor": -0.5, " planet": -1.0}, {"ld": -0.125}],
                    "text_offset": [5, 9],
                },
                "finish_reason": "length",
            }
        ],
    }
    exchange = Exchange.start("POST", "/v1/completions", "", "openai")
    exchange.response_json = response
    await upgrade(dbs.sqlite_url(tmp_path / "f.db"))
    found = await _completion_logprobs(dbs.sqlite_url(tmp_path / "f.db"), exchange)
    (shown,) = found["choices"]
    assert [(t["token"], t["logprob"]) for t in shown["tokens"]] == [(" wor", -0.5), ("ld", -0.125)]
    assert shown["tokens"][0]["top_logprobs"] == [
        {"token": " wor", "logprob": -0.5},
        {"token": " planet", "logprob": -1.0},
    ]
