"""The official SDK's WebSocket APIs through the proxy: `client.realtime.connect()` and
`client.responses.connect()`, async and sync, against a fake upstream that speaks OpenAI's
documented events (`tests/wsfake.py`). The frames the client gets through the proxy equal the
ones it gets directly, and each response is recorded as it completes."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import openai
import orjson
import pytest

from proxy.config import Upstream
from tests.conftest import ProxyFactory, RunningProxy
from tests.wsfake import AUDIO, WsUpstream, realtime_usage, ws_upstream

KEY = "sk-proj-wsSECRET0123456789abcdefWXYZ"


@pytest.fixture
async def fake() -> AsyncIterator[WsUpstream]:
    async with ws_upstream() as running:
        yield running


@pytest.fixture
async def ws_proxy(fake: WsUpstream, make_proxy: ProxyFactory) -> RunningProxy:
    return await make_proxy(upstreams=(Upstream("openai", fake.url + "/v1", "/v1"),))


async def _until(connection: Any, last: str, frames: list[bytes]) -> None:
    while True:
        frame = await connection.recv_bytes()
        frames.append(frame)
        if orjson.loads(frame)["type"] == last:
            return


async def realtime_session(base_url: str) -> list[bytes]:
    """A voice-agent session: configure, add an item, send audio, then a text, an audio and a
    tool-call response; every frame the client got."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0)
    frames: list[bytes] = []
    async with client.realtime.connect(model="gpt-realtime") as connection:
        frames.append(await connection.recv_bytes())  # session.created
        await connection.session.update(session={"type": "realtime", "instructions": "Be kind."})
        await _until(connection, "session.updated", frames)
        await connection.conversation.item.create(
            item={
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Hi"}],
            }
        )
        await _until(connection, "conversation.item.added", frames)
        await connection.input_audio_buffer.append(audio=base64.b64encode(AUDIO).decode())
        for what in ("text", "audio", "tool"):
            await connection.response.create(response={"instructions": what})
            await _until(connection, "response.done", frames)
    await client.close()
    return frames


async def test_realtime_through_the_proxy_is_the_same_session_and_each_response_is_recorded(
    fake: WsUpstream, ws_proxy: RunningProxy
) -> None:
    direct = await realtime_session(fake.url + "/v1")
    proxied = await realtime_session(ws_proxy.base_url)
    assert proxied == direct
    assert len(direct) == 3 + 5 + 6 + 5

    exchanges = await ws_proxy.recorder.wait_for(3)
    assert [ex.method for ex in exchanges] == ["WS"] * 3
    assert {ex.session for ex in exchanges} == {exchanges[0].session}
    assert exchanges[0].session is not None
    text, audio, tool = exchanges
    assert text.usage == realtime_usage(15, 0, 0, 4, 0)
    assert audio.usage == realtime_usage(20, 30, 8, 6, 25)
    assert tool.usage == realtime_usage(40, 0, 0, 12, 0)
    for ex in exchanges:
        assert (ex.path, ex.model, ex.outcome, ex.status) == (
            "/v1/realtime",
            "gpt-realtime",
            "ok",
            200,
        )
        assert ex.upstream_url == fake.url.replace("http://", "ws://") + "/v1/realtime"
        assert ex.key_hint == "sk-...WXYZ" and KEY not in str(ex)
        assert ex.ttft_ms is not None and ex.duration_ms is not None
        assert ex.ttft_ms <= ex.duration_ms
    assert text.request_json["event"]["response"] == {"instructions": "text"}
    assert text.request_json["session"]["instructions"] == "Be kind."
    assert text.request_json["items"] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
    ]
    # 7,680 bytes of 24 kHz 16-bit audio: counted, not kept (store_audio is off).
    assert text.request_json["input_audio"] == {"bytes": 7680, "seconds": 0.16}
    assert audio.request_json["items"] == [] and audio.request_json["input_audio"]["bytes"] == 0
    assert text.response_json["output"][0]["content"] == [
        {"type": "output_text", "text": "Hello wörld 🚀"}
    ]
    assert audio.response_json["output_audio"] == {"bytes": 7680, "seconds": 0.16}
    assert "audio" not in audio.response_json["output"][0]["content"][0]
    assert tool.response_json["output"][0]["arguments"] == '{"city": "Paris"}'
    assert (text.chunks, audio.chunks, tool.chunks) == (5, 6, 5)


async def responses_session(base_url: str) -> list[bytes]:
    """Two turns, the second continuing the first (`previous_response_id`)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0)
    frames: list[bytes] = []
    async with client.responses.connect() as connection:
        await connection.response.create(model="gpt-4.1", input="Hello")
        await _until(connection, "response.completed", frames)
        first = orjson.loads(frames[0])["response"]["id"]
        await connection.response.create(
            model="gpt-4.1", input="And again", previous_response_id=first
        )
        await _until(connection, "response.completed", frames)
    await client.close()
    return frames


async def test_responses_websocket_turns_are_recorded_as_streamed_posts(
    fake: WsUpstream, ws_proxy: RunningProxy
) -> None:
    direct = await responses_session(fake.url + "/v1")
    proxied = await responses_session(ws_proxy.base_url)
    assert proxied == direct
    first, second = await ws_proxy.recorder.wait_for(2)
    assert first.session == second.session is not None
    assert (first.method, first.path, first.stream) == ("POST", "/v1/responses", True)
    assert first.request_json == {"model": "gpt-4.1", "input": "Hello", "stream": True}
    assert second.request_json == {
        "model": "gpt-4.1",
        "input": "And again",
        "previous_response_id": "resp_0001",
        "stream": True,
    }
    final = orjson.loads(direct[-1])["response"]
    assert second.response_json == final
    usage = final["usage"]
    assert first.usage == second.usage == usage
    assert (second.model, second.response_model) == ("gpt-4.1", "gpt-4.1-2025-04-14")
    assert second.outcome == "ok" and second.ttft_ms is not None


def _sync_until(connection: Any, last: str, frames: list[bytes]) -> None:
    while True:
        frames.append(connection.recv_bytes())
        if orjson.loads(frames[-1])["type"] == last:
            return


def sync_sessions(base_url: str) -> list[bytes]:
    """The sync client: a Realtime session with two responses, then two Responses turns."""
    client = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0)
    frames: list[bytes] = []
    with client.realtime.connect(model="gpt-realtime") as connection:
        frames.append(connection.recv_bytes())
        for what in ("audio", "text"):
            connection.response.create(response={"instructions": what})
            _sync_until(connection, "response.done", frames)
    with client.responses.connect() as connection:
        connection.response.create(model="gpt-4.1", input="Hello")
        _sync_until(connection, "response.completed", frames)
        connection.response.create(model="gpt-4.1", input="Again", previous_response_id="resp_0001")
        _sync_until(connection, "response.completed", frames)
    client.close()
    return frames


async def test_the_sync_sdk_gets_the_same_frames_and_its_responses_are_recorded(
    fake: WsUpstream, ws_proxy: RunningProxy
) -> None:
    direct = await asyncio.to_thread(sync_sessions, fake.url + "/v1")
    proxied = await asyncio.to_thread(sync_sessions, ws_proxy.base_url)
    assert proxied == direct
    exchanges = await ws_proxy.recorder.wait_for(4)
    realtime = [ex for ex in exchanges if ex.method == "WS"]
    responses = [ex for ex in exchanges if ex.method == "POST"]
    assert [ex.usage for ex in realtime] == [
        realtime_usage(20, 30, 8, 6, 25),
        realtime_usage(15, 0, 0, 4, 0),
    ]
    assert len({ex.session for ex in realtime}) == len({ex.session for ex in responses}) == 1
    assert realtime[0].session != responses[0].session
    assert [ex.request_json["input"] for ex in responses] == ["Hello", "Again"]
    assert all(ex.outcome == "ok" and ex.usage is not None for ex in exchanges)
