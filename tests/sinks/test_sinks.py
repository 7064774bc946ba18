"""Sinks: every finished exchange reaches every sink, whatever its outcome; one sink failing
costs the others nothing; sinks start before the first exchange and stop after the last."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import aiohttp
import pytest
from aiohttp import web
from yarl import URL

from proxy.config import Config, Upstream
from proxy.exchange import Exchange
from proxy.relay.app import build_app, make_runner
from proxy.sinks.fanout import MemoryRecorder, Sinks
from tests.conftest import FakeUpstream, Sdk, _serve

KEY = "sk-test-0123456789abcdef"


class Throwaway:
    """A sink that keeps what it is given and what happened to it."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.exchanges: list[Exchange] = []

    async def start(self) -> None:
        self.events.append("start throwaway")

    def accept(self, exchange: Exchange) -> None:
        self.exchanges.append(exchange)

    async def stop(self) -> None:
        self.events.append(f"stop throwaway after {len(self.exchanges)}")


class Broken:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    async def start(self) -> None:
        self.events.append("start broken")

    def accept(self, exchange: Exchange) -> None:
        raise RuntimeError("bug in a sink")

    async def stop(self) -> None:
        self.events.append("stop broken")
        raise RuntimeError("bug while stopping")


async def _silent(request: web.Request) -> web.StreamResponse:
    await asyncio.sleep(5)
    return web.Response(text="late")


async def _leaving(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(b'data: {"choices":[]}\n\n')
    await asyncio.sleep(5)  # the client leaves before: the proxy cancels this
    return response


async def test_every_outcome_reaches_every_sink(
    upstream: FakeUpstream, sdk: Sdk, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[str] = []
    throwaway = Throwaway(events)
    config = replace(
        Config(),
        upstreams=(Upstream("openai", upstream.url, "/v1"),),
        read_timeout=0.5,
        max_request_bytes=1000,
    )
    recorder = MemoryRecorder()
    app = build_app(config, recorder, sinks=[Broken(events), throwaway])
    url, runner = await _serve(app, make_runner(app, config))
    assert events == ["start broken", "start throwaway"]
    with caplog.at_level(logging.ERROR, logger="proxy.sinks.fanout"):
        client = sdk(url + "/v1", KEY, max_retries=0)
        async for _ in await client.chat.completions.create(model="m", messages=[], stream=True):
            pass
        async with aiohttp.ClientSession() as session:
            for path, data, override in [
                ("/v1/nowhere", None, None),  # the upstream's 404
                ("/v1/chat/completions", b"{" + b" " * 2000 + b"}", None),  # max_request_bytes
                ("/v1/%2e%2e/x", None, None),  # leaves the base path
                ("/v1/models", None, _silent),  # read_timeout
            ]:
                upstream.override = override
                async with session.post(URL(url + path, encoded=True), data=data) as response:
                    await response.read()
            upstream.override = _leaving
            async with session.post(url + "/v1/chat/completions", data=b"{}") as response:
                await response.content.readany()
        recorded = await recorder.wait_for(6)
    outcomes = ["ok", "upstream_error", "proxy_error", "proxy_error", "timeout"]
    assert [ex.outcome for ex in recorded] == [*outcomes, "client_disconnected"]
    assert throwaway.exchanges == recorded  # the same exchanges, in the same order
    assert caplog.text.count("sink Broken failed to take exchange") == 6
    await runner.cleanup()
    assert events[2:] == ["stop throwaway after 6", "stop broken"]


async def test_a_sink_that_cannot_start_stops_those_started() -> None:
    events: list[str] = []

    class WillNotStart(Throwaway):
        async def start(self) -> None:
            raise OSError("no port")

    sinks = Sinks([Throwaway(events), WillNotStart(events)])
    with pytest.raises(OSError, match="no port"):
        await sinks.start()
    assert events == ["start throwaway", "stop throwaway after 0"]
