"""What today's models cost, priced as the exchange was: the real openai SDK through the real
proxy to a fake upstream that answers as OpenAI does (the tier it served, the usage).

Every expected figure is written from genai-prices 0.2.3's published per-1M rates
(`genai_prices/data.py`, the OpenAI provider), as the arithmetic a reader can check; the
headline ones are the issue's table (1M prompt + 1M completion tokens: gpt-5 $11.25,
flex $5.625, priority $22.50; gpt-5.1 $11.25; gpt-5.4 $27.50 and gpt-5.5 $55.00 at their
long-context rates; gpt-realtime text $20.00). Costs are compared to 1e-9 dollars.
"""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from openai.types.realtime.realtime_response_usage import RealtimeResponseUsage

from proxy.exchange import Exchange
from proxy.pricing import Prices
from proxy.sinks.fanout import MemoryRecorder, Sinks
from proxy.store import create_engine
from proxy.store.read import get_exchange, render_exchange
from proxy.store.report import cost_report
from tests import dbs
from tests.conftest import FakeUpstream, ProxyFactory, Sdk
from tests.dbs import chat_usage

M = 1_000_000
ANSWERED = {
    "gpt-5": "gpt-5-2025-08-07",
    "gpt-5.1": "gpt-5.1-2025-11-13",
    "gpt-5.2": "gpt-5.2-2025-12-11",
    "gpt-5.4": "gpt-5.4-2026-03-05",
    "gpt-5.5": "gpt-5.5-2026-04-23",
    "o3": "o3-2025-04-16",
    "gpt-5.9-preview": "gpt-5.9-preview",
}
"""The dated snapshot the fake upstream says answered each model asked for."""


async def answer(request: web.Request) -> web.StreamResponse:
    """Chat Completions and Responses as OpenAI answers them: the tier it served (`default`
    for `auto` or none) and the usage the test put in the `x-usage` header."""
    body = await request.json()
    tier = body.get("service_tier") or "auto"
    served = "default" if tier == "auto" else tier
    usage = orjson.loads(request.headers["x-usage"])
    model = ANSWERED[body["model"]]
    if request.path == "/v1/responses":
        details = usage["prompt_tokens_details"]
        out: dict[str, Any] = {
            "id": "resp_1", "object": "response", "created_at": int(time.time()),
            "status": "completed", "model": model, "service_tier": served, "output": [],
            "usage": {
                "input_tokens": usage["prompt_tokens"],
                "input_tokens_details": {"cached_tokens": details["cached_tokens"],
                                         "cache_write_tokens": 0},
                "output_tokens": usage["completion_tokens"],
                "output_tokens_details": usage["completion_tokens_details"],
                "total_tokens": usage["total_tokens"],
            },
        }  # fmt: skip
        return web.json_response(out)
    message = {"role": "assistant", "content": "ok", "refusal": None}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
    return web.json_response(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "service_tier": served,
            "system_fingerprint": "fp_1",
            "choices": [choice],
            "usage": usage,
        }
    )


CASES = [
    # model, tier asked, usage, dollars (genai-prices 0.2.3, USD per 1M tokens), price entry
    ("gpt-5", None, chat_usage(M, M), "11.25", "openai/gpt-5 standard"),  # 1.25 + 10
    ("gpt-5", "flex", chat_usage(M, M), "5.625", "openai/gpt-5 flex"),  # 0.625 + 5
    ("gpt-5", "priority", chat_usage(M, M), "22.50", "openai/gpt-5 priority"),  # 2.5 + 20
    ("gpt-5.1", "default", chat_usage(M, M), "11.25", "openai/gpt-5.1 standard"),  # 1.25 + 10
    ("gpt-5.1", "flex", chat_usage(M, M), "5.625", "openai/gpt-5.1 flex"),  # 0.625 + 5
    ("gpt-5.1", "priority", chat_usage(M, M), "22.50", "openai/gpt-5.1 priority"),  # 2.5 + 20
    ("gpt-5.2", None, chat_usage(M, M), "15.75", "openai/gpt-5.2 standard"),  # 1.75 + 14
    ("gpt-5.2", "flex", chat_usage(M, M), "7.875", "openai/gpt-5.2 flex"),  # 0.875 + 7
    ("gpt-5.2", "priority", chat_usage(M, M), "31.50", "openai/gpt-5.2 priority"),  # 3.5 + 28
    # Past 272,000 prompt tokens the whole exchange pays the long-context rates.
    ("gpt-5.4", None, chat_usage(M, M), "27.50", "openai/gpt-5.4 standard >272000"),  # 5 + 22.5
    ("gpt-5.4", "flex", chat_usage(M, M), "13.75", "openai/gpt-5.4 flex >272000"),  # 2.5 + 11.25
    ("gpt-5.4", "priority", chat_usage(M, M), "35.00", "openai/gpt-5.4 priority"),  # 5 + 30, flat
    ("gpt-5.4", None, chat_usage(200_000, 100_000), "2.00", "openai/gpt-5.4 standard"),  # .5 + 1.5
    ("gpt-5.5", None, chat_usage(M, M), "55.00", "openai/gpt-5.5 standard >272000"),  # 10 + 45
    ("gpt-5.5", "flex", chat_usage(M, M), "27.50", "openai/gpt-5.5 flex >272000"),  # 5 + 22.5
    ("gpt-5.5", "priority", chat_usage(M, M), "87.50", "openai/gpt-5.5 priority"),  # 12.5 + 75
    ("o3", None, chat_usage(M, M), "10.00", "openai/o3 standard"),  # 2 + 8
    ("o3", "flex", chat_usage(M, M), "5.00", "openai/o3 flex"),  # 1 + 4
    ("o3", "priority", chat_usage(M, M), "17.50", "openai/o3 priority"),  # 3.5 + 14
    # Cached input at the cached rate; reasoning inside output, never added again:
    # 600k x 1.25 + 400k x 0.125 + 1M x 10, and at flex 600k x 0.625 + 400k x 0.0625 + 1M x 5.
    ("gpt-5.1", None, chat_usage(M, M, 400_000, 600_000), "10.80", "openai/gpt-5.1 standard"),
    ("gpt-5.1", "flex", chat_usage(M, M, 400_000, 600_000), "5.40", "openai/gpt-5.1 flex"),
    # Long context with cache: 200k x 5 + 100k x 0.5 + 10k x 22.5.
    ("gpt-5.4", None, chat_usage(300_000, 10_000, 100_000, 4_000), "1.275",
     "openai/gpt-5.4 standard >272000"),
]  # fmt: skip


def cost_of(ex: Exchange) -> Decimal:
    assert ex.cost_usd is not None, (ex.model_name, ex.price_entry)
    return Decimal(ex.cost_usd)


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_each_model_and_tier_is_priced_at_its_published_rate(
    api: str, upstream: FakeUpstream, make_proxy: ProxyFactory, sdk: Sdk, tmp_path: Path
) -> None:
    upstream.override = answer
    proxy = await make_proxy()
    client = sdk(proxy.base_url, "sk-test")
    for model, tier, usage, _, _ in CASES:
        extra: dict[str, Any] = {} if tier is None else {"service_tier": tier}
        headers = {"x-usage": orjson.dumps(usage).decode()}
        if api == "chat":
            said = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}],
                extra_headers=headers, **extra,
            )  # fmt: skip
        else:
            said = await client.responses.create(
                model=model, input="hi", extra_headers=headers, **extra
            )
        assert said.service_tier == (tier or "default")
    found = await proxy.recorder.wait_for(len(CASES))
    for ex, (model, tier, usage, dollars, entry) in zip(found, CASES, strict=True):
        assert abs(cost_of(ex) - Decimal(dollars)) < Decimal("1e-9"), (model, tier, ex.cost_usd)
        assert ex.price_entry == f"genai-prices 0.2.3 {entry}", (model, tier)
        assert ex.model_name == ANSWERED[model] and ex.service_tier == (tier or "default")
        assert ex.tokens is not None and ex.tokens.input == usage["prompt_tokens"]

    # Stored, shown, reported: the same figure and where it came from.
    url = dbs.sqlite_url(tmp_path / "prices.db")
    await dbs.recorded(url, found)
    engine = create_engine(url)
    try:
        shown = await get_exchange(engine, found[1].id)  # gpt-5 at flex
        by_model = {row["group"]: row for row in await cost_report(engine, "model")}
    finally:
        await engine.dispose()
    assert (shown["cost_usd"], shown["service_tier"]) == (5.625, "flex")
    assert shown["price_entry"] == "genai-prices 0.2.3 openai/gpt-5 flex"
    assert shown["tokens"]["prompt"] == M and shown["tokens"]["completion"] == M
    assert "$5.625000000 (genai-prices 0.2.3 openai/gpt-5 flex)" in render_exchange(shown)
    assert by_model["gpt-5-2025-08-07"]["cost_usd"] == Decimal("39.375")  # 11.25 + 5.625 + 22.5


async def test_an_unknown_model_is_unpriced_and_counted(
    upstream: FakeUpstream, make_proxy: ProxyFactory, sdk: Sdk, tmp_path: Path
) -> None:
    upstream.override = answer
    proxy = await make_proxy()
    client = sdk(proxy.base_url, "sk-test")
    await client.chat.completions.create(
        model="gpt-5.9-preview", messages=[{"role": "user", "content": "hi"}],
        extra_headers={"x-usage": orjson.dumps(chat_usage(1000, 10)).decode()},
    )  # fmt: skip
    (ex,) = await proxy.recorder.wait_for(1)
    assert (ex.cost_usd, ex.price_entry) == (None, None)
    assert ex.tokens is not None and ex.tokens.input == 1000
    url = dbs.sqlite_url(tmp_path / "unknown.db")
    await dbs.recorded(url, [ex])
    engine = create_engine(url)
    try:
        (row,) = await cost_report(engine, "model")
    finally:
        await engine.dispose()
    assert (row["group"], row["cost_usd"], row["unpriced_requests"]) == ("gpt-5.9-preview", None, 1)


def realtime(usage: RealtimeResponseUsage) -> Exchange:
    """A Realtime exchange as the WebSocket relay hands it over: `response.done`'s usage."""
    ex = Exchange.start("GET", "/v1/realtime", "model=gpt-realtime", "openai")
    ex.upstream_url = "https://api.openai.com/v1/realtime"
    ex.model = ex.response_model = "gpt-realtime-2025-08-28"
    ex.status = 101
    ex.usage = usage.model_dump(mode="json", exclude_none=True)
    return ex


async def test_gpt_realtime_text_and_audio_tokens() -> None:
    text = realtime(
        RealtimeResponseUsage.model_validate(
            dict(
                input_tokens=M,
                output_tokens=M,
                total_tokens=2 * M,
                input_token_details={"text_tokens": M, "audio_tokens": 0, "cached_tokens": 0},
                output_token_details={"text_tokens": M, "audio_tokens": 0},
            )
        )
    )
    # 1M input of which 600k audio; 200k cached (150k of it audio, 50k text); 1M output of
    # which 700k audio. Leaves: 150k cached audio x 0.4 + 50k cached text x 0.4
    # + 450k audio x 32 + 350k text x 4 + 700k audio out x 64 + 300k text out x 16.
    audio = realtime(
        RealtimeResponseUsage.model_validate(
            dict(
                input_tokens=M,
                output_tokens=M,
                total_tokens=2 * M,
                input_token_details={
                    "text_tokens": 400_000,
                    "audio_tokens": 600_000,
                    "cached_tokens": 200_000,
                    "cached_tokens_details": {"text_tokens": 50_000, "audio_tokens": 150_000},
                },
                output_token_details={"text_tokens": 300_000, "audio_tokens": 700_000},
            )
        )
    )
    recorder = MemoryRecorder()
    sinks = Sinks([recorder], prices=Prices())
    sinks.accept(text)
    sinks.accept(audio)
    entry = "genai-prices 0.2.3 openai/gpt-realtime standard"
    assert (cost_of(text), text.price_entry) == (Decimal("20.00"), entry)  # 4 + 16
    assert abs(cost_of(audio) - Decimal("65.48")) < Decimal("1e-9") and audio.price_entry == entry
