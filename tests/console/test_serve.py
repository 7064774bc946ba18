"""`flightrec serve` also serves the console: the exchanges just sent are listed on it; with
`--workers N` exactly one console listens (worker 0's) and the token stays out of the log."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import reserved_port
from tests.test_serve import _start_serve, _stream, slow_upstream

__all__ = ["slow_upstream"]  # the fixture


async def _console_lists(console: str, count: int, headers: dict[str, str]) -> list[str]:
    async with aiohttp.ClientSession(headers=headers) as session:
        for _ in range(100):  # the recorder writes in the background: bounded wait
            async with session.get(console + "/api/exchanges") as response:
                assert response.status == 200
                items = (await response.json())["items"]
            if len(items) >= count:
                return [item["id"] for item in items]
            await asyncio.sleep(0.1)
    raise AssertionError(f"the console never listed {count} exchanges")


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_serve_serves_the_console_once(
    tmp_path: Path, slow_upstream: str, workers: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "console-token-never-logged-42"
    monkeypatch.setenv("FLIGHTREC_CONSOLE_TOKEN", token)
    with reserved_port() as port:  # until the console listens on it
        process, url, _ = await _start_serve(
            tmp_path, slow_upstream, "--workers", workers, console_port=port
        )
    console = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            sent = await asyncio.gather(*(_stream(session, url, asyncio.Event()) for _ in range(3)))
            assert len(sent) == 3
            async with session.get(console + "/api/exchanges") as response:
                assert response.status == 401
        await _console_lists(console, 3, {"Authorization": f"Bearer {token}"})
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    log = (tmp_path / "serve.log").read_text()
    assert log.count(f"console on http://127.0.0.1:{port}") == 1, log
    assert "already in use" not in log.lower() and token not in log
    for name in os.listdir(tmp_path):
        assert token.encode() not in (tmp_path / name).read_bytes(), name
