"""A raw aiohttp WebSocket client through the proxy, recording into a real SQLite database and
its journal: binary frames both ways, the subprotocol the upstream picks, headers as for HTTP,
a browser's key subprotocol never on disk, a refused handshake passed through and recorded,
and the usage and cost of each response in the database."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import WSMsgType, web

from proxy.config import Config, Frozen, Upstream
from proxy.relay.app import build_app, make_runner
from proxy.store import upgrade
from proxy.store.browse import list_exchanges
from proxy.store.read import get_exchange, reading
from proxy.store.recorder import DatabaseRecorder
from tests.conftest import start_site
from tests.wsfake import AUDIO, WsUpstream, realtime_usage, ws_upstream

KEY = "sk-proj-BROWSERsecret0123456789abcdefQRST"
PROTOCOLS = ("realtime", f"openai-insecure-api-key.{KEY}", "openai-beta.realtime-v1")
PRICES = {  # gpt-realtime's published rates, USD per 1M tokens
    "gpt-realtime": {
        "input": 4.0,
        "cached_input": 0.4,
        "output": 16.0,
        "audio_input": 32.0,
        "audio_output": 64.0,
    }
}


@dataclass
class Recording:
    url: str
    db_url: str
    folder: Path
    runner: web.AppRunner


@pytest.fixture
async def fake() -> AsyncIterator[WsUpstream]:
    async with ws_upstream() as running:
        yield running


@pytest.fixture
async def recording(fake: WsUpstream, tmp_path: Path) -> AsyncIterator[Recording]:
    db_url = f"sqlite+aiosqlite:///{tmp_path / 'flightrec.db'}"
    await upgrade(db_url)
    config = replace(
        Config(),
        upstreams=(Upstream("openai", fake.url + "/v1", "/v1"),),
        db_url=db_url,
        spool_path=str(tmp_path / "flightrec.spool"),
        batch_interval=0.01,
        prices=Frozen(PRICES),
    )
    app = build_app(config, DatabaseRecorder(config))
    runner = make_runner(app, config)
    await runner.setup()
    yield Recording(await start_site(runner), db_url, tmp_path, runner)
    await runner.cleanup()


async def _events_until(ws: aiohttp.ClientWebSocketResponse, last: str) -> list[dict[str, object]]:
    events = []
    while True:
        msg = await ws.receive()
        assert msg.type is WSMsgType.TEXT, msg
        events.append(orjson.loads(msg.data))
        if events[-1]["type"] == last:
            return events


async def test_a_browser_session_passes_whole_and_its_key_never_reaches_the_disk(
    fake: WsUpstream, recording: Recording
) -> None:
    headers = {
        "OpenAI-Beta": "realtime=v1",
        "X-Flightrec-Tag-Team": "voice",
        "X-Flightrec-Session": "call-42",
    }
    url = recording.url + "/v1/realtime?model=gpt-realtime"
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(url, protocols=PROTOCOLS, headers=headers, max_msg_size=0) as ws,
    ):
        assert ws.protocol == "realtime"
        assert (await ws.receive_json())["type"] == "session.created"
        payload = bytes(range(256)) * 20480  # 5 MiB: past aiohttp's default message limit
        await ws.send_bytes(payload)
        echo = await ws.receive()
        assert (echo.type, echo.data) == (WSMsgType.BINARY, payload[::-1])
        audio = base64.b64encode(AUDIO).decode()
        await ws.send_str(
            orjson.dumps({"type": "input_audio_buffer.append", "audio": audio}).decode()
        )
        await ws.send_json({"type": "response.create", "response": {"instructions": "audio"}})
        await _events_until(ws, "response.done")
        await ws.send_json({"type": "response.create", "response": {"instructions": "text"}})
        await _events_until(ws, "response.done")
        await ws.close(code=4000, message=b"bye now")
    seen = fake.handshakes[0]
    assert seen["Sec-WebSocket-Protocol"].split(",") == list(PROTOCOLS)
    assert seen["OpenAI-Beta"] == "realtime=v1"
    assert not any(name.lower().startswith("x-flightrec") for name in seen)
    assert fake.received[0] == payload
    assert fake.closes == [4000]  # the client's close code reached the upstream
    await recording.runner.cleanup()

    async with reading(recording.db_url) as engine:
        listed = list(reversed(await list_exchanges(engine)))
        shown = [await get_exchange(engine, item["id"]) for item in listed]
    assert [ex["method"] for ex in shown] == ["WS", "WS"]
    assert {ex["session"] for ex in shown} == {"call-42"}  # the client's X-Flightrec-Session
    audio_turn, text_turn = shown
    assert audio_turn["usage"] == realtime_usage(20, 30, 8, 6, 25)
    assert text_turn["usage"] == realtime_usage(15, 0, 0, 4, 0)
    # Audio in: 30 tokens at $32/1M; text in: 20 - 8 cached at $4/1M, 8 cached at $0.40/1M;
    # audio out: 25 at $64/1M; text out: 6 at $16/1M.
    assert audio_turn["cost_usd"] == pytest.approx(
        (30 * 32 + 12 * 4 + 8 * 0.4 + 25 * 64 + 6 * 16) / 1e6, rel=1e-12
    )
    assert text_turn["cost_usd"] == pytest.approx((15 * 4 + 4 * 16) / 1e6, rel=1e-12)
    assert audio_turn["tags"] == {"team": "voice"}
    assert audio_turn["key_hint"] == "sk-...QRST"
    assert audio_turn["request"]["input_audio"] == {"bytes": 7680, "seconds": 0.16}

    written = [path for path in recording.folder.rglob("*") if path.is_file()]
    assert any(path.name == "flightrec.db" for path in written)
    for path in written:
        assert KEY.encode() not in path.read_bytes(), path
        assert KEY[8:30].encode() not in path.read_bytes(), path


async def test_a_refused_handshake_reaches_the_client_and_is_recorded(
    fake: WsUpstream, recording: Recording
) -> None:
    error = {
        "error": {
            "message": "Incorrect API key provided.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    fake.refuse = (401, orjson.dumps(error))
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await session.ws_connect(recording.url + "/v1/realtime", protocols=PROTOCOLS)
        assert refused.value.status == 401
        # What a client that reads the refusal gets: the upstream's body.
        headers = {
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": base64.b64encode(b"0123456789abcdef").decode(),
            "Authorization": f"Bearer {KEY}",
        }
        async with session.get(recording.url + "/v1/responses", headers=headers) as response:
            assert response.status == 401
            assert await response.json() == error
    await recording.runner.cleanup()
    async with reading(recording.db_url) as engine:
        listed = await list_exchanges(engine)
        shown = [await get_exchange(engine, item["id"]) for item in listed]
    assert [(ex["status"], ex["outcome"]) for ex in shown] == [(401, "upstream_error")] * 2
    assert {ex["error"] for ex in shown} == {"Incorrect API key provided."}
    assert {ex["key_hint"] for ex in shown} == {"sk-...QRST"}
    assert len({ex["session"] for ex in shown}) == 2 and None not in {ex["session"] for ex in shown}
    for path in recording.folder.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


async def test_a_client_that_stops_reading_holds_the_upstream_back(
    fake: WsUpstream, recording: Recording
) -> None:
    """The proxy reads the upstream's next frame only once the last one was written to the
    client: with the client not reading, the upstream can send no more than the sockets
    between them hold, not the 256 MiB it tries to."""
    count, size = 4096, 64 * 1024
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(recording.url + "/v1/other", max_msg_size=0) as ws,
    ):
        await ws.send_json({"type": "flood", "count": count, "size": size})
        await asyncio.sleep(1.0)
        held_back = fake.flooded
        assert held_back * size < 48 * 1024 * 1024, held_back  # the sockets hold ~15 MiB here
        for n in range(count):
            msg = await ws.receive()
            assert msg.type is WSMsgType.BINARY and len(msg.data) == size
            assert int.from_bytes(msg.data[:4], "big") == n
    assert fake.flooded == count


async def test_the_upstreams_close_code_and_reason_reach_the_client(
    fake: WsUpstream, recording: Recording
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(recording.url + "/v1/other") as ws,
    ):
        await ws.send_json({"type": "close", "code": 4100, "reason": "rate limited"})
        msg = await ws.receive()
        assert (msg.type, msg.data, msg.extra) == (WSMsgType.CLOSE, 4100, "rate limited")
