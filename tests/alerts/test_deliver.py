"""Delivery: a webhook that fails is retried with backoff; one that is dead costs a log line."""

from __future__ import annotations

import asyncio
import logging
import time
from itertools import pairwise

import orjson
import pytest
from aiohttp import web

from proxy.alerts.deliver import TRIES, Delivery
from tests.conftest import reserved_port, serving


async def test_a_failing_webhook_is_retried_until_it_takes_the_message() -> None:
    seen: list[tuple[float, str]] = []

    async def flaky(request: web.Request) -> web.Response:
        seen.append((time.monotonic(), orjson.loads(await request.read())["text"]))
        return web.Response(status=503 if len(seen) < 3 else 200)

    delivery = Delivery(backoff=0.2)
    async with serving("/hook", flaky) as url:
        delivery.send("flightrec alert x FIRING", ["webhook"], url + "/hook", firing=True)
        await delivery.stop()
    assert [text for _, text in seen] == ["flightrec alert x FIRING"] * 3
    waits = [later - earlier for (earlier, _), (later, _) in pairwise(seen)]
    assert 0.2 <= waits[0] < 0.35  # 0.2 s, then doubled
    assert 0.4 <= waits[1] < 0.6


async def test_a_dead_webhook_gives_up_with_one_line_naming_its_host_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with reserved_port() as port:  # nothing listens: every try is refused
        url = f"http://127.0.0.1:{port}/services/T000/SECRET"
        delivery = Delivery(backoff=0.01)
        began = time.monotonic()
        with caplog.at_level(logging.INFO, "proxy.alerts"):
            delivery.send("flightrec alert x FIRING", ["log", "webhook"], url, firing=True)
            assert time.monotonic() - began < 0.05  # sending never waits for the webhook
            await delivery.stop()
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0] == "flightrec alert x FIRING"
    assert lines[1].startswith(f"alert webhook 127.0.0.1:{port}: not delivered (")
    assert lines[1].endswith("): flightrec alert x FIRING")
    assert "SECRET" not in "".join(lines)
    assert len(lines) == 2
    assert TRIES == 5


async def test_a_webhook_refusing_the_body_is_not_retried() -> None:
    calls = 0

    async def refuses(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        return web.Response(status=400)

    delivery = Delivery(backoff=0.01)
    async with serving("/hook", refuses) as url:
        delivery.send("text", ["webhook"], url + "/hook", firing=False)
        await asyncio.sleep(0.2)
        await delivery.stop()
    assert calls == 1
