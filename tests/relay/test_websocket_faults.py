"""WebSocket sessions under faults, with real processes: `flightrec serve`, the fake upstream
(`python -m tests.wsfake`) and, where the client must vanish, a client process killed with
SIGKILL. What SPEC section 11 promises holds: a response left half way is recorded with what
came and who left; SIGTERM gives open sessions the grace, then closes them with 1001 and
records them; kill -9 loses no response that had completed."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import WSMsgType

from proxy.store.browse import list_exchanges
from proxy.store.read import get_exchange, reading
from tests.faultkit import ROOT, Serve, _wait_port, held_port, stop_process, wait_stored

pytestmark = pytest.mark.faults

CLIENT = """
import asyncio, sys, aiohttp
async def main():
    async with aiohttp.ClientSession() as s, s.ws_connect(sys.argv[1]) as ws:
        await ws.send_json({"type": "response.create", "response": {"instructions": "slow"}})
        async for msg in ws:
            if b"output_text.delta" in msg.data.encode():
                print("delta", flush=True)
asyncio.run(main())
"""
"""A client that starts a slow Realtime response, says when its first delta came, and waits."""


@contextlib.contextmanager
def fake_upstream(pause: float) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The fake WebSocket upstream in its own process: its base URL, and the process."""
    with held_port() as held:
        port = int(held.getsockname()[1])
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.wsfake", str(port), str(pause)], cwd=ROOT
        )
        try:
            _wait_port(port, process, 30)
            yield f"http://127.0.0.1:{port}/v1", process
        finally:
            stop_process(process)


@contextlib.contextmanager
def serving(workdir: Path, upstream: str, **settings: Any) -> Iterator[Serve]:
    (workdir / "journal").mkdir(exist_ok=True)
    config = {
        "db_url": f"sqlite+aiosqlite:///{workdir / 'flightrec.db'}",
        "spool_path": str(workdir / "journal" / "flightrec.spool"),
        "batch_interval": 0.01,
        **settings,
    }
    serve = Serve(workdir, upstream, config)
    try:
        yield serve
    finally:
        serve.release()


async def recorded(serve: Serve, count: int, within: float = 20) -> list[dict[str, Any]]:
    """The exchanges in serve's database, oldest first, once there are `count`."""
    db_url = serve.settings["db_url"]
    deadline = time.monotonic() + within
    while True:
        async with reading(db_url) as engine:
            listed = await list_exchanges(engine)
            if len(listed) >= count or time.monotonic() > deadline:
                shown = [await get_exchange(engine, item["id"]) for item in reversed(listed)]
                assert len(shown) == count, (shown, serve.log_text())
                return shown
        await asyncio.sleep(0.2)


def _text(shown: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "")
        for item in shown["response"]["output"]
        for part in item.get("content") or ()
    )


async def _until_type(ws: aiohttp.ClientWebSocketResponse, wanted: str) -> None:
    async for msg in ws:
        if msg.type is WSMsgType.TEXT and orjson.loads(msg.data)["type"] == wanted:
            return
    raise AssertionError(f"closed before {wanted}")


async def test_a_client_killed_mid_response_is_recorded_with_what_came(tmp_path: Path) -> None:
    with fake_upstream(pause=0.5) as (upstream, _), serving(tmp_path, upstream) as serve:
        await serve.start()
        url = serve.url.replace("http", "ws") + "/v1/realtime?model=gpt-realtime"
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-c", CLIENT, url, stdout=asyncio.subprocess.PIPE
        )
        assert client.stdout is not None
        assert await asyncio.wait_for(client.stdout.readline(), 30) == b"delta\n"
        client.kill()
        await client.wait()
        [shown] = await recorded(serve, 1)
        serve.terminate()
        assert await serve.exited(30) == 0
    assert shown["outcome"] == "client_disconnected"
    assert shown["error"] == "client left mid-response"
    assert _text(shown) == "Hello"  # the first delta, all that came


async def test_an_upstream_killed_mid_response_closes_the_client_1014_and_is_recorded(
    tmp_path: Path,
) -> None:
    with fake_upstream(pause=0.5) as (upstream, fake), serving(tmp_path, upstream) as serve:
        await serve.start()
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(serve.url + "/v1/realtime?model=gpt-realtime") as ws,
        ):
            await ws.send_json({"type": "response.create", "response": {"instructions": "slow"}})
            await _until_type(ws, "response.output_text.delta")
            fake.kill()
            closing = await asyncio.wait_for(ws.receive(), 10)
            assert (closing.type, ws.close_code) == (WSMsgType.CLOSE, 1014)
        [shown] = await recorded(serve, 1)
    assert shown["outcome"] == "upstream_disconnected"
    assert shown["error"] == "upstream left mid-response"
    assert _text(shown) == "Hello"


async def test_sigterm_gives_open_sessions_the_grace_then_closes_them_1001(
    tmp_path: Path,
) -> None:
    """Grace 3 s: a response that takes 1.5 s completes; one that takes 6 s is cut, as every
    exchange still in flight after the grace is, and its session closed with 1001."""
    with (
        fake_upstream(pause=0.5) as (upstream, _),
        serving(tmp_path, upstream, shutdown_grace=3.0) as serve,
    ):
        await serve.start()
        url = serve.url + "/v1/realtime?model=gpt-realtime"
        async with aiohttp.ClientSession() as session:
            short = await session.ws_connect(url)
            long = await session.ws_connect(url)
            await short.send_json({"type": "response.create", "response": {"instructions": "slow"}})
            await long.send_json(
                {"type": "response.create", "response": {"instructions": "slower"}}
            )
            await _until_type(short, "response.output_text.delta")
            await _until_type(long, "response.output_text.delta")
            serve.terminate()
            stopped = time.monotonic()
            await _until_type(short, "response.done")
            for ws in (short, long):
                while (await asyncio.wait_for(ws.receive(), 10)).type is not WSMsgType.CLOSE:
                    pass
                assert ws.close_code == 1001
            closed_after = time.monotonic() - stopped
            await short.close()
            await long.close()
        assert await serve.exited(30) == 0
        shown = await recorded(serve, 2)
    assert 2.5 < closed_after < 5.0
    outcomes = {_text(ex): ex["outcome"] for ex in shown}
    assert outcomes == {"Hello wörld 🚀": "ok", "Hello wörld": "proxy_error"}
    [cut] = [ex for ex in shown if ex["outcome"] == "proxy_error"]
    assert cut["error"] == "cut at shutdown: shutdown_grace (3s) over; session closed (1001)"


async def test_kill_9_after_two_completed_responses_loses_neither(tmp_path: Path) -> None:
    with fake_upstream(pause=0.5) as (upstream, _), serving(tmp_path, upstream) as serve:
        await serve.start()
        async with (
            aiohttp.ClientSession() as session,
            session.ws_connect(serve.url + "/v1/responses") as ws,
        ):
            await ws.send_json({"type": "response.create", "model": "gpt-4.1", "input": "Hi"})
            await _until_type(ws, "response.completed")
            await ws.send_json({"type": "response.create", "model": "gpt-4.1", "input": "Again"})
            await _until_type(ws, "response.completed")
            await ws.send_json({"type": "response.create", "model": "gpt-4.1", "input": "slow"})
            await asyncio.sleep(0.05)
            serve.kill()
        await serve.start()
        shown = await recorded(serve, 2)
        assert await wait_stored(serve.settings["db_url"], set(), 0) == {ex["id"] for ex in shown}
    assert [ex["request"]["input"] for ex in shown] == ["Hi", "Again"]
    assert shown[0]["session"] == shown[1]["session"] is not None
    assert [ex["outcome"] for ex in shown] == ["ok", "ok"]
    assert all(ex["usage"]["total_tokens"] == 35 for ex in shown)
