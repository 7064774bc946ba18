"""SIGTERM while exchanges outlast `shutdown_grace` (`proxy/relay/inflight.py`): a real `flightrec
serve` process, a real upstream slower than the grace, a real SQLite database.

A container engine sends SIGTERM and, 10 s later (Docker, podman) or 30 s (Kubernetes),
SIGKILL. What has not finished when the grace is over must be recorded as cut and journaled
before the process exits, and the process must exit soon after the grace, not after the
exchanges."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import reserved_port, serving, wait_until_up

UPSTREAM_SECONDS = 15.0
GRACE = 1.0
CUT = f"cut at shutdown: shutdown_grace ({GRACE:g}s) over"

FIRST_EVENT = (
    b'data: {"id":"chatcmpl-s","object":"chat.completion.chunk","created":1,"model":"m",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},'
    b'"finish_reason":null}]}\n\n'
)


async def _slow(request: web.Request) -> web.StreamResponse:
    """A stream sends its first event and then nothing for 15 s; anything else gets no
    answer at all for 15 s."""
    body = await request.json()
    if not body.get("stream"):
        await asyncio.sleep(UPSTREAM_SECONDS)
        return web.json_response({"error": "too late"}, status=500)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(FIRST_EVENT)
    await asyncio.sleep(UPSTREAM_SECONDS)
    with contextlib.suppress(ConnectionResetError):  # the proxy cut it long ago
        await response.write(b"data: [DONE]\n\n")
    return response


@pytest.fixture
async def slow_upstream() -> AsyncIterator[str]:
    async with serving("/v1/chat/completions", _slow) as url:
        yield url + "/v1"


async def _start(tmp_path: Path, upstream: str) -> tuple[asyncio.subprocess.Process, str]:
    env = {
        **os.environ,
        "FLIGHTREC_SHUTDOWN_GRACE": str(GRACE),
        "FLIGHTREC_SPOOL_PATH": str(tmp_path / "spool"),
        "FLIGHTREC_DB_URL": f"sqlite+aiosqlite:///{tmp_path / 'serve.db'}",
        "FLIGHTREC_CONSOLE_PORT": "0",
        "FLIGHTREC_UPSTREAM": upstream,
    }
    log = (tmp_path / "serve.log").open("wb")
    with reserved_port() as port:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", "serve", "--port", str(port),
            env=env, stdout=log, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        url = f"http://127.0.0.1:{port}"
        await wait_until_up(url + "/readyz", process)
    return process, url


async def _post(session: aiohttp.ClientSession, url: str, stream: bool) -> str:
    """Send one request; its exchange id once the proxy has sent it upstream (a stream's
    first event has reached the client; a plain request has been in flight a moment)."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    response = await session.post(url + "/v1/chat/completions", json=body)
    assert await response.content.readuntil(b"\n\n") == FIRST_EVENT
    return response.headers["X-Flightrec-Id"]


def _rows(db: Path) -> list[tuple[str, str, int | None, str | None, int]]:
    with sqlite3.connect(db) as conn:
        query = "SELECT id, outcome, status, error, stream FROM exchanges ORDER BY id"
        return conn.execute(query).fetchall()


async def test_exchanges_that_outlast_the_grace_are_recorded_as_cut_before_exit(
    tmp_path: Path, slow_upstream: str
) -> None:
    process, url = await _start(tmp_path, slow_upstream)
    async with aiohttp.ClientSession() as session:
        stream_id = await _post(session, url, stream=True)
        plain = asyncio.create_task(
            session.post(url + "/v1/chat/completions", json={"model": "m", "messages": []})
        )
        await asyncio.sleep(0.3)  # the plain request is waiting on the upstream
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), UPSTREAM_SECONDS - 5) == 0
        took = time.monotonic() - signalled
        with pytest.raises(aiohttp.ClientError):
            await (await plain).read()
    # Well before the upstream would have answered: the grace, then the cut and the record.
    assert GRACE <= took < GRACE + 3, took
    rows = _rows(tmp_path / "serve.db")
    assert [(r[1], r[3], r[4]) for r in rows] == [
        ("proxy_error", CUT, 1),
        ("proxy_error", CUT, 0),
    ]
    assert rows[0][0] == stream_id
    assert [r[2] for r in rows] == [200, None]  # the stream had its status; the other none
    assert b"cut 2 exchanges still running" in (tmp_path / "serve.log").read_bytes()
