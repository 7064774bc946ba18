"""Load shedding with real processes: a `flightrec serve` past `max_streams` or
`max_connections` answers 503 in OpenAI's shape with `Retry-After`, records it, and resets no
connection (`proxy/relay/load.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web

from proxy.config import ConfigError, load
from proxy.relay.load import asks_to_stream
from proxy.relay.usage_option import upstream_body
from tests.conftest import start_site
from tests.faultkit import COMPLETION, Serve

HOLD = 3.0
"""Seconds the upstream holds each stream open between its two halves."""


def _chunk(delta: dict[str, Any], finish: str | None = None, **more: Any) -> bytes:
    chunk = {
        "id": "chatcmpl-load",
        "object": "chat.completion.chunk",
        "created": 1_723_024_748,
        "model": "gpt-4o-mini-2024-07-18",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        **more,
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


FIRST = _chunk({"role": "assistant", "content": "Hello"})
REST = (
    _chunk({}, "stop")
    + _chunk({}, choices=[], usage={"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9})
    + b"data: [DONE]\n\n"
)


@contextlib.asynccontextmanager
async def slow_upstream() -> AsyncIterator[str]:
    """An OpenAI-shaped upstream whose streams last `HOLD` seconds; answers at once otherwise."""

    async def chat(request: web.Request) -> web.StreamResponse:
        payload = orjson.loads(await request.read())
        if not payload.get("stream"):
            return web.Response(body=COMPLETION, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(FIRST)
        await asyncio.sleep(HOLD)
        await response.write(REST)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        yield await start_site(runner) + "/v1"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, **settings: Any) -> AsyncIterator[Serve]:
    async with slow_upstream() as upstream:
        serve = Serve(tmp_path, upstream, {"db_url": f"sqlite+aiosqlite:///{tmp_path}/f.db"})
        serve.settings.update(settings)
        await serve.start()
        try:
            yield serve
        finally:
            serve.release()


async def call(url: str, *, stream: bool) -> tuple[int, dict[str, str], bytes]:
    """One request on a connection of its own: status, headers, the whole body. A reset or a
    connection closed before the answer's end raises."""
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.post(f"{url}/v1/chat/completions", json={**body, "stream": stream}) as response,
    ):
        return response.status, dict(response.headers), await response.read()


def stored(tmp_path: Path) -> list[tuple[int, str, str | None]]:
    with contextlib.closing(sqlite3.connect(tmp_path / "f.db")) as con:
        found = con.execute("SELECT status, outcome, error FROM exchanges ORDER BY id")
        return [tuple(row) for row in found]


def assert_shed(status: int, headers: dict[str, str], body: bytes, limit: str) -> None:
    assert status == 503
    assert headers["Retry-After"] == "1"
    assert orjson.loads(body) == {
        "error": {
            "message": f"flightrec: overloaded: this worker is at {limit}; retry in 1 s",
            "type": "server_error",
            "param": None,
            "code": "overloaded",
        }
    }


async def test_streams_past_max_streams_get_a_recorded_503(tmp_path: Path) -> None:
    async with serving(tmp_path, max_streams=5) as serve:
        streams = [asyncio.create_task(call(serve.url, stream=True)) for _ in range(60)]
        await asyncio.sleep(HOLD / 2)  # the first five hold their slots meanwhile
        plain = await asyncio.gather(*(call(serve.url, stream=False) for _ in range(10)))
        sdk = openai.AsyncOpenAI(base_url=serve.url + "/v1", api_key="sk-test", max_retries=0)
        with pytest.raises(openai.InternalServerError) as refused:
            await sdk.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True
            )
        await sdk.close()
        answers = await asyncio.gather(*streams)  # raises on any reset
        serve.terminate()
        assert await serve.exited(30) == 0
    assert [status for status, _, _ in plain] == [200] * 10  # the stream limit is for streams
    assert refused.value.status_code == 503
    assert refused.value.response.headers["retry-after"] == "1"
    served = [a for a in answers if a[0] == 200]
    assert len(served) == 5
    assert all(body.endswith(b"data: [DONE]\n\n") for _, _, body in served)
    for status, headers, body in (a for a in answers if a[0] != 200):
        assert_shed(status, headers, body, "max_streams (5)")
    records = stored(tmp_path)
    assert len(records) == 60 + 10 + 1  # every request, shed or not
    shed_error = "overloaded: this worker is at max_streams (5)"
    assert records.count((503, "proxy_error", shed_error)) == 55 + 1
    assert records.count((200, "ok", None)) == 5 + 10


async def test_connections_past_max_connections_get_a_503_and_are_closed(
    tmp_path: Path,
) -> None:
    async with serving(tmp_path, max_connections=4) as serve:
        idle = [await asyncio.open_connection("127.0.0.1", serve.port) for _ in range(4)]
        await asyncio.sleep(0.2)  # accepted and counted
        answers = await asyncio.gather(*(call(serve.url, stream=False) for _ in range(40)))
        for _, writer in idle:
            writer.close()
        await asyncio.sleep(0.2)
        after = await call(serve.url, stream=False)
        serve.terminate()
        assert await serve.exited(30) == 0
    for status, headers, body in answers:
        assert_shed(status, headers, body, "max_connections (4)")
        assert headers["Connection"] == "close"
    assert after[0] == 200
    records = stored(tmp_path)
    assert len(records) == 41
    shed_error = "overloaded: this worker is at max_connections (4)"
    assert records.count((503, "proxy_error", shed_error)) == 40


@pytest.mark.parametrize("key", ["max_connections", "max_streams"])
@pytest.mark.parametrize("value", [0, -1, "many"])
def test_limits_must_be_positive_integers(tmp_path: Path, key: str, value: Any) -> None:
    path = tmp_path / "c.toml"
    path.write_text(f"{key} = {orjson.dumps(value).decode()}\n")
    with pytest.raises(ConfigError, match=key):
        load(path, env={})


@pytest.mark.parametrize(
    ("body", "streams"),
    [
        (b'{"model": "m", "stream": true}', True),
        (b'{"model": "m", "stream": false}', False),
        (b'{"model": "m", "messages": [{"content": "\\"stream\\": true"}]}', False),
        (b'{"model": "m"}', False),
        (b"stream=true", False),  # not JSON: a form upload never streams
    ],
)
def test_a_stream_is_read_off_the_body_when_usage_is_not_injected(
    body: bytes, streams: bool
) -> None:
    # With stream_usage = "passthrough" the body is not parsed to ask for usage.
    assert asks_to_stream(upstream_body(body, inject=False)) is streams
    assert asks_to_stream(upstream_body(body, inject=True)) is streams
