"""`price_update`: off by default, no outbound call for prices; on, the running proxy takes
fresher genai-prices data from the URL it is given (here a local server) and prices with it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from genai_prices import data_snapshot

from tests.conftest import ProxyFactory, Sdk, start_site

FRESH = [
    {
        "id": "openai",
        "name": "OpenAI",
        "api_pattern": r"https://api\.openai\.com",
        "models": [
            {
                "id": "gpt-5",
                "match": {"equals": "gpt-5"},
                "prices": {"input_mtok": 1, "output_mtok": 2},
            }
        ],
    }
]
"""genai-prices' published data format (a list of providers), with gpt-5 at $1/$2."""


class PriceServer:
    def __init__(self) -> None:
        self.asked = 0
        self.url = ""

    async def data(self, request: web.Request) -> web.Response:
        self.asked += 1
        return web.json_response(FRESH)


@pytest.fixture
async def price_server() -> AsyncIterator[PriceServer]:
    server = PriceServer()
    app = web.Application()
    app.router.add_get("/data.json", server.data)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    server.url = await start_site(runner) + "/data.json"
    yield server
    await runner.cleanup()
    data_snapshot.set_custom_snapshot(None)  # the data is process-wide: back to the bundled


def _updating() -> bool:
    return any(t.name == "genai_prices:update" for t in threading.enumerate())


async def _ask(sdk: Sdk, base_url: str) -> None:
    await sdk(base_url, "sk-test").chat.completions.create(
        model="gpt-5", messages=[{"role": "user", "content": "hi"}]
    )


def _answer_as(model: str, usage: dict[str, Any]) -> Any:
    async def handle(request: web.Request) -> web.Response:
        message = {"role": "assistant", "content": "ok", "refusal": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
        body = {"id": "c", "object": "chat.completion", "created": 1, "model": model}
        return web.json_response(body | {"choices": [choice], "usage": usage})

    return handle


USAGE = {"prompt_tokens": 1_000_000, "completion_tokens": 1_000_000, "total_tokens": 2_000_000}


async def test_off_by_default_no_call_is_made(
    upstream: Any, make_proxy: ProxyFactory, sdk: Sdk, price_server: PriceServer
) -> None:
    upstream.override = _answer_as("gpt-5", USAGE)
    proxy = await make_proxy(price_update_url=price_server.url)
    assert proxy.config.price_update is False
    await _ask(sdk, proxy.base_url)
    (ex,) = await proxy.recorder.wait_for(1)
    await asyncio.sleep(0.5)
    assert price_server.asked == 0 and not _updating()
    assert (ex.cost_usd, ex.price_entry) == (11.25, "genai-prices 0.2.3 openai/gpt-5 standard")


async def test_on_the_proxy_prices_with_the_data_it_fetched(
    upstream: Any, make_proxy: ProxyFactory, sdk: Sdk, price_server: PriceServer
) -> None:
    upstream.override = _answer_as("gpt-5", USAGE)
    proxy = await make_proxy(price_update=True, price_update_url=price_server.url)
    for _ in range(100):
        if data_snapshot.get_snapshot().from_auto_update:
            break
        await asyncio.sleep(0.05)
    assert price_server.asked == 1
    await _ask(sdk, proxy.base_url)
    (ex,) = await proxy.recorder.wait_for(1)
    assert ex.cost_usd == 3.0  # 1M x 1 + 1M x 2, the fetched prices
    assert ex.price_entry is not None
    assert ex.price_entry.startswith("genai-prices 0.2.3 data 20")
    assert ex.price_entry.endswith(" openai/gpt-5 standard")
