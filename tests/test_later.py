"""`Later`: work no client waits for runs a moment on, in one batch, and none is lost on close."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import aiohttp
import pytest

from proxy.app import build_app, make_runner
from proxy.config import Config, Upstream
from proxy.keys import APP_LATER
from proxy.later import Later
from proxy.recorder import MemoryRecorder

from .conftest import FakeUpstream, _serve, until


async def test_work_runs_a_moment_later_in_order() -> None:
    later = Later(delay=0.02)
    done: list[int] = []
    for i in range(3):
        later.add(done.append, i)
    await asyncio.sleep(0)
    assert done == [] and len(later) == 3
    await until(lambda: len(later) == 0)
    assert done == [0, 1, 2]
    later.add(done.append, 3)  # a new batch gets a new timer
    await until(lambda: len(later) == 0)
    assert done == [0, 1, 2, 3]


async def test_flush_runs_what_is_pending_and_close_makes_later_work_immediate() -> None:
    later = Later(delay=60)
    done: list[str] = []
    later.add(done.append, "a")
    later.flush()
    assert done == ["a"]
    later.add(done.append, "b")
    assert done == ["a"]  # not closed: still deferred
    later.flush(close=True)
    later.add(done.append, "c")
    assert done == ["a", "b", "c"]


async def test_a_failing_piece_of_work_does_not_cost_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    later = Later(delay=0.01)
    done: list[int] = []

    def broken() -> None:
        raise RuntimeError("bug")

    later.add(done.append, 1)
    later.add(broken)
    later.add(done.append, 2)
    with caplog.at_level(logging.ERROR, logger="proxy.later"):
        await until(lambda: len(later) == 0)
    assert done == [1, 2]
    assert "deferred work" in caplog.text and "RuntimeError: bug" in caplog.text


async def test_stopping_the_server_hands_records_still_waiting_to_the_recorder(
    upstream: FakeUpstream,
) -> None:
    config = replace(Config(), upstreams=(Upstream("openai", upstream.url, "/v1"),))
    recorder = MemoryRecorder()
    app = build_app(config, recorder)
    app[APP_LATER] = Later(delay=60)  # nothing would complete before the server stops
    url, runner = await _serve(app, make_runner(app, config))
    async with aiohttp.ClientSession() as session, session.get(url + "/v1/models") as response:
        assert response.status == 200
    assert recorder.exchanges == []
    await runner.cleanup()
    [exchange] = recorder.exchanges
    assert (exchange.path, exchange.status, exchange.outcome) == ("/v1/models", 200, "ok")
