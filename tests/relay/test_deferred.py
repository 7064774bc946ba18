"""`Deferred`: work no client waits for runs a moment on, in one batch, none lost on close."""

from __future__ import annotations

import asyncio
import logging
import weakref
from dataclasses import replace

import aiohttp
import pytest
from aiohttp import web

from proxy.config import Config, Upstream
from proxy.exchange import Exchange
from proxy.relay.app import build_app, make_runner
from proxy.relay.appkeys import APP_DEFERRED
from proxy.relay.deferred import Deferred
from proxy.sinks.fanout import MemoryRecorder
from tests.conftest import FakeUpstream, _serve, until


async def test_work_runs_a_moment_later_in_order() -> None:
    later = Deferred(delay=0.02)
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
    later = Deferred(delay=60)
    done: list[str] = []
    later.add(done.append, "a")
    later.flush()
    assert done == ["a"]
    later.add(done.append, "b")
    assert done == ["a"]  # not closed: still deferred
    later.flush(close=True)
    later.add(done.append, "c")
    assert done == ["a", "b", "c"]


async def test_a_batch_lets_go_of_each_work_s_arguments_once_it_has_run() -> None:
    """What a record's completion builds (a response's parsed JSON, hundreds of dicts with
    logprobs) must be freed before the batch's next record is completed, not kept to the
    batch's end where the collections that record's work sets off would walk it."""

    class Built:
        pass

    later = Deferred(delay=60)
    alive: list[list[bool]] = []
    refs: list[weakref.ref[Built]] = []

    def complete(record: Built) -> None:
        alive.append([ref() is not None for ref in refs])  # those completed before this one
        refs.append(weakref.ref(record))

    for _ in range(4):
        later.add(complete, Built())
    later.flush()
    assert alive == [[], [False], [False, False], [False, False, False]]


async def test_work_after_one_that_stops_the_process_waits_for_the_next_flush() -> None:
    """A work that raises past the batch's handler (KeyboardInterrupt) stops the batch; the
    works after it are not dropped: the shutdown's flush runs them, records included."""
    later = Deferred(delay=60)
    done: list[int] = []

    def interrupted() -> None:
        raise KeyboardInterrupt

    later.add(done.append, 1)
    later.add(interrupted)
    later.add(done.append, 2)
    later.add(done.append, 3)
    with pytest.raises(KeyboardInterrupt):
        later.flush()
    assert done == [1] and len(later) == 2
    later.flush(close=True)
    assert done == [1, 2, 3]


async def test_a_failing_piece_of_work_does_not_cost_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    later = Deferred(delay=0.01)
    done: list[int] = []

    def broken() -> None:
        raise RuntimeError("bug")

    later.add(done.append, 1)
    later.add(broken)
    later.add(done.append, 2)
    with caplog.at_level(logging.ERROR, logger="proxy.relay.deferred"):
        await until(lambda: len(later) == 0)
    assert done == [1, 2]
    assert "deferred work" in caplog.text and "RuntimeError: bug" in caplog.text


async def test_stopping_the_server_hands_records_still_waiting_to_the_recorder(
    upstream: FakeUpstream,
) -> None:
    config = replace(Config(), upstreams=(Upstream("openai", upstream.url, "/v1"),))
    recorder = MemoryRecorder()
    app = build_app(config, recorder)
    app[APP_DEFERRED] = Deferred(delay=60)  # nothing would complete before the server stops
    url, runner = await _serve(app, make_runner(app, config))
    async with aiohttp.ClientSession() as session, session.get(url + "/v1/models") as response:
        assert response.status == 200
    assert recorder.exchanges == []
    await runner.cleanup()
    [exchange] = recorder.exchanges
    assert (exchange.path, exchange.status, exchange.outcome) == ("/v1/models", 200, "ok")


async def test_a_lone_exchange_s_first_piece_runs_what_is_pending() -> None:
    later = Deferred(delay=60)
    done: list[int] = []
    later.add(done.append, 1)
    later.under_way = 2
    assert not later.first_piece_sent()
    assert done == []  # another exchange is under way: the batch keeps its timer
    later.under_way = 1
    assert later.first_piece_sent()
    assert done == [1] and len(later) == 0
    assert not later.first_piece_sent()  # nothing pending: nothing to do
    assert done == [1]


async def test_records_go_on_at_a_lone_exchange_s_first_byte_and_wait_under_concurrency(
    upstream: FakeUpstream,
) -> None:
    """A client sending one request after another has the earlier records completed right
    after its next first byte, not on that request's way; with two exchanges under way the
    records wait for their batch."""
    release = asyncio.Event()

    async def answer(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": []})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"id":"c1","choices":[]}\n\n')
        await release.wait()
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    upstream.override = answer
    config = replace(Config(), upstreams=(Upstream("openai", upstream.url, "/v1"),))
    recorder = MemoryRecorder()
    app = build_app(config, recorder)
    later = app[APP_DEFERRED] = Deferred(delay=60)  # only a first byte (or the end) sends them on
    url, runner = await _serve(app, make_runner(app, config))
    try:
        async with aiohttp.ClientSession() as session:

            async def models() -> None:
                async with session.get(url + "/v1/models") as response:
                    assert response.status == 200
                    await response.read()

            await models()
            assert recorder.exchanges == [] and len(later) == 1
            body = {"model": "gpt-4o", "stream": True, "messages": []}
            async with session.post(url + "/v1/chat/completions", json=body) as stream:
                assert (await stream.content.readline()).startswith(b"data: ")
                await until(lambda: len(recorder.exchanges) == 1, within=5)
                assert later.under_way == 1
                await models()  # its first byte went out while the stream was under way
                await models()
                assert len(recorder.exchanges) == 1 and len(later) == 2
                release.set()
                assert (await stream.read()).endswith(b"data: [DONE]\n\n")
            await until(lambda: later.under_way == 0)
            await models()
            await until(lambda: len(recorder.exchanges) == 4, within=5)
            paths = [ex.path for ex in recorder.exchanges]
            assert paths == ["/v1/models", "/v1/models", "/v1/models", "/v1/chat/completions"]
    finally:
        release.set()
        await runner.cleanup()
    assert len(recorder.exchanges) == 5 and later.under_way == 0


async def test_what_the_records_leave_for_the_loop_s_turn_runs_before_the_response_ends(
    upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lone client's previous record goes to the sinks after the next first piece; what a
    sink leaves for the end of the loop's turn (the journal's line) runs before that response
    ends too: after its end it would meet the client's next request."""
    events: list[str] = []

    class Journaling(MemoryRecorder):
        def accept(self, exchange: Exchange) -> None:
            super().accept(exchange)
            asyncio.get_running_loop().call_soon(events.append, f"journal {exchange.path}")

    write_eof = web.StreamResponse.write_eof

    async def noting_write_eof(self: web.StreamResponse, data: bytes = b"") -> None:
        if "X-Flightrec-Id" in self.headers and not self._eof_sent:  # aiohttp ends it twice
            events.append("end")
        await write_eof(self, data)

    async def answer(request: web.Request) -> web.StreamResponse:
        if request.path == "/v1/models":
            return web.json_response({"object": "list", "data": []})
        body = b'data: {"id":"c1","choices":[]}\n\ndata: [DONE]\n\n'  # in one piece
        return web.Response(body=body, headers={"Content-Type": "text/event-stream"})

    upstream.override = answer
    monkeypatch.setattr(web.StreamResponse, "write_eof", noting_write_eof)
    config = replace(Config(), upstreams=(Upstream("openai", upstream.url, "/v1"),))
    recorder = Journaling()
    app = build_app(config, recorder)
    app[APP_DEFERRED] = Deferred(delay=60)  # only the next first piece sends a record on
    url, runner = await _serve(app, make_runner(app, config))
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/v1/models") as response:
                await response.read()
            body = {"model": "gpt-4o", "stream": True, "messages": []}
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                assert (await response.read()).endswith(b"data: [DONE]\n\n")
        assert events == ["end", "journal /v1/models", "end"]
    finally:
        await runner.cleanup()
