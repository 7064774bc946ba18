"""`/metrics` counts WebSocket sessions open and frames relayed, read live from the relay."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import aiohttp
from prometheus_client import generate_latest

from proxy.config import Config, Upstream
from proxy.relay.app import build_app, make_runner
from proxy.relay.websocket import APP_WS_SESSIONS
from proxy.sinks.fanout import MemoryRecorder
from proxy.sinks.metrics import MetricsSink
from proxy.sinks.wsmetrics import watch
from tests.conftest import start_site
from tests.wsfake import ws_upstream


def _value(text: str, series: str) -> float:
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not in /metrics:\n{text}")


async def test_sessions_open_and_frames_are_on_metrics() -> None:
    async with ws_upstream() as fake:
        config = replace(Config(), upstreams=(Upstream("openai", fake.url + "/v1", "/v1"),))
        metrics = MetricsSink(config)
        app = build_app(config, MemoryRecorder(), sinks=[metrics])
        watch(metrics.registry, app[APP_WS_SESSIONS])
        runner = make_runner(app, config)
        await runner.setup()
        try:
            url = await start_site(runner) + "/v1/realtime?model=gpt-realtime"
            async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
                await ws.receive()  # session.created
                await ws.send_bytes(b"\x00\x01")
                await ws.receive()  # the echo
                await ws.send_json({"type": "response.create"})
                while (await ws.receive_json())["type"] != "response.done":
                    pass
                text = generate_latest(metrics.registry).decode()
                assert _value(text, "flightrec_websocket_sessions_open") == 1
                # From the client: the binary frame and response.create; from the upstream:
                # session.created, the echo, response.created, 3 deltas, response.done.
                frames = 'flightrec_websocket_frames_total{direction="%s"}'
                assert _value(text, frames % "client_to_upstream") == 2
                assert _value(text, frames % "upstream_to_client") == 7
            await ws.close()
            for _ in range(100):
                text = generate_latest(metrics.registry).decode()
                if _value(text, "flightrec_websocket_sessions_open") == 0:
                    break
                await asyncio.sleep(0.02)
            assert _value(text, "flightrec_websocket_sessions_open") == 0
            assert _value(text, frames % "upstream_to_client") == 7
        finally:
            await runner.cleanup()
