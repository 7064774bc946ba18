"""With `[[redact]]` rules, redaction runs on a worker thread: the event loop serves other
requests while an exchange is redacted, exchanges still reach the sinks in order, shutdown
delivers those being redacted, and a redaction that fails or never ends costs only bodies.

The slow redaction is a real `Keep` held at a gate the test opens (no timing asserted): before
the worker, `Keep` ran on the loop, so a held redaction held every request."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import orjson
import pytest

from proxy.config import Config, Upstream
from proxy.exchange import Exchange
from proxy.privacy.keep import Keep
from proxy.privacy.redact import parse_rules
from proxy.relay.app import build_app, make_runner
from proxy.relay.appkeys import APP_SINKS
from proxy.sinks.fanout import MemoryRecorder, Sinks
from tests.conftest import FakeUpstream, _serve

HOLD = "hold-this-one"
"""A request holding this is held at the gate while being kept."""
EMAIL = "someone@example.com"


class GatedKeep(Keep):
    """The real `Keep`, held at a gate for exchanges whose request holds `HOLD`."""

    def __init__(self, config: Config, *, fail: bool = False) -> None:
        super().__init__(config)
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.held_too_long = False
        self.fail = fail

    def __call__(self, ex: Exchange) -> None:
        if HOLD.encode() in (ex.request_body or b""):
            self.entered.set()
            self.held_too_long = not self.gate.wait(10)
            if self.fail:
                raise RuntimeError("a bug after the redaction's own guard")
        super().__call__(ex)


@dataclass
class Proxy:
    url: str
    runner: Any
    recorder: MemoryRecorder
    keep: GatedKeep


def config(upstream: FakeUpstream, grace: float = 30) -> Config:
    rules = parse_rules([{"preset": "email"}], ValueError)
    upstreams = (Upstream("openai", upstream.url, "/v1"),)
    return replace(Config(), upstreams=upstreams, redact=rules, shutdown_grace=grace)


@pytest.fixture
async def proxy(upstream: FakeUpstream) -> AsyncIterator[Proxy]:
    running = await start(config(upstream))
    yield running
    running.keep.gate.set()
    await running.runner.cleanup()


async def start(cfg: Config, *, fail: bool = False) -> Proxy:
    recorder = MemoryRecorder()
    app = build_app(cfg, recorder)
    keep = GatedKeep(cfg, fail=fail)
    app[APP_SINKS] = Sinks([recorder], keep, cfg.shutdown_grace)
    url, runner = await _serve(app, make_runner(app, cfg))
    return Proxy(url, runner, recorder, keep)


async def ask(url: str, text: str) -> int:
    body = {"model": "m", "messages": [{"role": "user", "content": text}]}
    endpoint = url + "/v1/chat/completions"
    async with (
        aiohttp.ClientSession() as session,
        session.post(endpoint, data=orjson.dumps(body)) as answer,
    ):
        await answer.read()
        return answer.status


async def held(keep: GatedKeep) -> None:
    """Until the worker holds an exchange at the gate."""
    assert await asyncio.to_thread(keep.entered.wait, 10)


def content(ex: Exchange) -> str:
    return str(ex.request_json["messages"][0]["content"])


async def test_other_requests_are_served_while_one_is_redacted(proxy: Proxy) -> None:
    big = f"{HOLD} {EMAIL} " + "-----BEGIN PRIVATE KEY-----\n" * 40_000  # about 1 MB
    assert await ask(proxy.url, big) == 200
    await held(proxy.keep)
    for _ in range(3):  # answered while the big one's redaction is held
        assert await ask(proxy.url, f"small {EMAIL}") == 200
    assert not proxy.keep.gate.is_set() and proxy.recorder.exchanges == []
    proxy.keep.gate.set()
    recorded = await proxy.recorder.wait_for(4)
    assert not proxy.keep.held_too_long
    assert content(recorded[0]).startswith(f"{HOLD} [REDACTED:email] -----BEGIN")  # in order
    assert [content(ex) for ex in recorded[1:]] == ["small [REDACTED:email]"] * 3
    assert all(ex.redacted == {"rules": ["email"]} for ex in recorded)


async def test_shutdown_delivers_the_exchanges_being_redacted(upstream: FakeUpstream) -> None:
    running = await start(config(upstream))
    assert await ask(running.url, f"{HOLD} {EMAIL}") == 200
    assert await ask(running.url, f"after {EMAIL}") == 200
    await held(running.keep)
    stopping = asyncio.create_task(running.runner.cleanup())
    await asyncio.sleep(0.2)
    assert not stopping.done() and running.recorder.exchanges == []  # waiting for the worker
    running.keep.gate.set()
    await asyncio.wait_for(stopping, 10)
    recorded = running.recorder.exchanges
    assert [content(ex) for ex in recorded] == [
        f"{HOLD} [REDACTED:email]",
        "after [REDACTED:email]",
    ]
    assert not running.keep.held_too_long


async def test_a_redaction_past_the_grace_is_recorded_without_bodies(
    upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    running = await start(config(upstream, grace=0.2))
    try:
        assert await ask(running.url, f"{HOLD} {EMAIL}") == 200
        await held(running.keep)
        await asyncio.wait_for(running.runner.cleanup(), 10)
    finally:
        running.keep.gate.set()
    [ex] = running.recorder.exchanges
    assert ex.request_body is None and ex.request_json is None and ex.response_body is None
    assert ex.redacted == {"rules": [], "failed": True} and ex.outcome == "ok"
    assert "1 exchanges still being redacted after 0.2s: recorded without bodies" in caplog.text


async def test_a_keep_that_raises_still_hands_the_exchange_on(
    upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    running = await start(config(upstream), fail=True)
    running.keep.gate.set()
    try:
        assert await ask(running.url, f"{HOLD} {EMAIL}") == 200
        assert await ask(running.url, f"after {EMAIL}") == 200
        first, second = await running.recorder.wait_for(2)
    finally:
        await running.runner.cleanup()
    assert first.request_body is None and first.redacted == {"rules": [], "failed": True}
    assert content(second) == "after [REDACTED:email]"
    assert "keeping it failed" in caplog.text
