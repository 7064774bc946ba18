"""`flightrec serve` as users run it: a real process, real signals, a real database."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import reserved_port, serving, wait_until_up

EVENTS = 20
PAUSE = 0.05  # a stream lasts about a second


def _event(n: int) -> bytes:
    return (
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        b'[{"index":0,"delta":{"content":"w%d "},"finish_reason":null}]}\n\n' % n
    )


EXPECTED = b"".join(_event(n) for n in range(EVENTS)) + b"data: [DONE]\n\n"


async def _slow_stream(request: web.Request) -> web.StreamResponse:
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for n in range(EVENTS):
        await response.write(_event(n))
        await asyncio.sleep(PAUSE)
    await response.write(b"data: [DONE]\n\n")
    return response


@pytest.fixture
async def slow_upstream() -> AsyncIterator[str]:
    async with serving("/v1/chat/completions", _slow_stream) as url:
        yield url + "/v1"


async def _start_serve(
    tmp_path: Path, upstream: str, *extra: str, console_port: int = 0
) -> tuple[asyncio.subprocess.Process, str, Path]:
    with reserved_port() as port:  # until serve listens on it
        return await _serve_on(port, tmp_path, upstream, *extra, console_port=console_port)


async def _serve_on(
    port: int, tmp_path: Path, upstream: str, *extra: str, console_port: int = 0
) -> tuple[asyncio.subprocess.Process, str, Path]:
    db = tmp_path / "serve.db"
    env = {
        **os.environ,
        "FLIGHTREC_SPOOL_PATH": str(tmp_path / "spool"),
        "FLIGHTREC_SHUTDOWN_GRACE": "15",
        "FLIGHTREC_STREAM_USAGE": "passthrough",
        "FLIGHTREC_LOG_LEVEL": "debug",
        "FLIGHTREC_CONSOLE_PORT": str(console_port),  # 0: none, so runs never share 8081
    }
    log = (tmp_path / "serve.log").open("wb")  # a file: a pipe nobody reads would fill up
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "serve", "--port", str(port), "--upstream", upstream,
        "--db", f"sqlite+aiosqlite:///{db}", *extra,
        env=env, stdout=log, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    log.close()
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_until_up(url + "/readyz", process)
    except AssertionError as exc:
        process.kill()
        await process.wait()
        raise AssertionError(f"{exc}:\n{(tmp_path / 'serve.log').read_text()}") from None
    return process, url, db


KEY = "sk-proj-NEVER-STORE-THIS-0123456789"


async def _stream(session: aiohttp.ClientSession, url: str, started: asyncio.Event) -> bytes:
    body = {"model": "m", "messages": [], "stream": True}
    headers = {"Authorization": f"Bearer {KEY}", "Cookie": f"session={KEY}"}
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as response:
        first = await response.content.readuntil(b"\n\n")
        started.set()
        return first + await response.read()


def _read(path: Path) -> bytes:
    return path.read_bytes()


def _rows(db: Path) -> list[tuple[str, str, int]]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT id, outcome, status FROM exchanges").fetchall()


async def test_sigterm_lets_50_streams_finish_and_records_them_all(
    tmp_path: Path, slow_upstream: str
) -> None:
    process, url, db = await _start_serve(tmp_path, slow_upstream)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        started = [asyncio.Event() for _ in range(50)]
        streams = [asyncio.create_task(_stream(session, url, s)) for s in started]
        await asyncio.wait_for(asyncio.gather(*(s.wait() for s in started)), 20)
        process.send_signal(signal.SIGTERM)
        bodies = await asyncio.wait_for(asyncio.gather(*streams), 20)
    assert all(body == EXPECTED for body in bodies)
    assert await asyncio.wait_for(process.wait(), 20) == 0
    rows = _rows(db)
    assert len(rows) == 50 and len({r[0] for r in rows}) == 50
    assert {(outcome, status) for _, outcome, status in rows} == {("ok", 200)}
    # The key reached the upstream, but appears in no log line and no file the proxy wrote.
    assert b"DEBUG" in _read(tmp_path / "serve.log")
    for name in os.listdir(tmp_path):
        assert KEY.encode() not in _read(tmp_path / name), name


@pytest.mark.skipif(not hasattr(__import__("socket"), "SO_REUSEPORT"), reason="no SO_REUSEPORT")
async def test_workers_share_the_port_and_the_database(tmp_path: Path, slow_upstream: str) -> None:
    process, url, db = await _start_serve(tmp_path, slow_upstream, "--workers", "2")
    children = [p for p in os.listdir("/proc") if p.isdigit() and _parent_of(p) == process.pid]
    assert len(children) >= 2
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as s:
        bodies = await asyncio.gather(*(_stream(s, url, asyncio.Event()) for _ in range(12)))
    assert all(body == EXPECTED for body in bodies)
    process.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(process.wait(), 30) == 0
    assert len(_rows(db)) == 12
    # each worker spools to a file of its own
    assert {"spool.0", "spool.1"} <= set(os.listdir(tmp_path))


def _parent_of(pid: str) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])
