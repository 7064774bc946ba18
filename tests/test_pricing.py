"""Pricing: genai-prices' data as flightrec applies it, and config prices that win over it.

Expected dollar figures are written here from genai-prices 0.2.3's published per-1M rates
(`genai_prices/data.py`), as the arithmetic a reader can check, and compared exactly: a cost
is the float nearest the exact amount, so `Decimal(cost)` is within 1e-9 of the figure.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from genai_prices import data_snapshot
from genai_prices.data import providers
from genai_prices.types import ModelPrice
from genai_prices.types import Usage as GenaiUsage

from proxy.pricing import Priced, Prices
from proxy.rates import CLASSES, compile_rates, model_price_fields
from proxy.usage import Usage

M = 1_000_000
OPENAI = "https://api.openai.com/v1"
NOW = datetime(2026, 11, 27, 12, tzinfo=UTC).timestamp()
"""A start time after every dated price these tests name (flex and priority: 2026-10-12)."""


def tokens(
    prompt: int, completion: int, *, cached: int = 0, reasoning: int = 0, **more: int
) -> Usage:
    return Usage(
        input=prompt, cached=cached, cache_write=more.get("cache_write", 0),
        input_audio=more.get("input_audio", 0), cached_audio=more.get("cached_audio", 0),
        input_image=0, cached_image=0, output=completion, reasoning=reasoning,
        output_audio=more.get("output_audio", 0), output_image=0,
    )  # fmt: skip


def price(model: str, usage: Usage, **where: Any) -> Priced | None:
    where.setdefault("base_url", OPENAI)
    where.setdefault("started_at", NOW)
    return Prices().price(usage, model, **where)


def assert_costs(found: Priced | None, dollars: str, source: str) -> None:
    assert found is not None
    assert abs(Decimal(found.cost_usd) - Decimal(dollars)) < Decimal("1e-9"), found
    assert found.source == source


@pytest.mark.parametrize(
    ("model", "tier", "dollars", "variant"),
    [
        ("gpt-5", None, "11.25", "standard"),  # 1M x 1.25 + 1M x 10
        ("gpt-5", "default", "11.25", "standard"),
        ("gpt-5", "auto", "11.25", "standard"),
        ("gpt-5", "scale", "11.25", "standard"),  # no published scale rate: the standard one
        ("gpt-5", "flex", "5.625", "flex"),  # 1M x 0.625 + 1M x 5
        ("gpt-5", "priority", "22.50", "priority"),  # 1M x 2.5 + 1M x 20
        ("gpt-5.2", "priority", "31.50", "priority"),  # 1M x 3.5 + 1M x 28
    ],
)
def test_the_tier_the_response_reports_chooses_the_price(
    model: str, tier: str | None, dollars: str, variant: str
) -> None:
    found = price(model, tokens(M, M), service_tier=tier)
    assert_costs(found, dollars, f"genai-prices 0.2.3 openai/{model} {variant}")


def test_tier_prices_apply_from_their_published_date() -> None:
    before = datetime(2026, 10, 11, 23, 59, tzinfo=UTC).timestamp()
    found = price("gpt-5", tokens(M, M), service_tier="flex", started_at=before)
    assert_costs(found, "11.25", "genai-prices 0.2.3 openai/gpt-5 standard")


def test_dated_prices_follow_the_exchange_start() -> None:
    # o3: $10/$40 until 2025-06-09, $2/$8 from 2025-06-10 (UTC dates).
    june_9 = datetime(2025, 6, 9, 23, 59, 59, tzinfo=UTC).timestamp()
    june_10 = datetime(2025, 6, 10, tzinfo=UTC).timestamp()
    assert_costs(
        price("o3", tokens(M, M), started_at=june_9), "50", "genai-prices 0.2.3 openai/o3 standard"
    )
    assert_costs(
        price("o3", tokens(M, M), started_at=june_10), "10", "genai-prices 0.2.3 openai/o3 standard"
    )


def test_off_peak_prices_follow_the_time_of_day() -> None:
    # deepseek-chat: $0.27/$1.10 from 00:30 to 16:30 UTC, $0.135/$0.55 otherwise.
    day = datetime(2026, 11, 27, 12, tzinfo=UTC).timestamp()
    night = datetime(2026, 11, 27, 20, tzinfo=UTC).timestamp()
    url = "https://api.deepseek.com/v1"
    prices = Prices()
    peak = prices.price(tokens(M, M), "deepseek-chat", base_url=url, started_at=day)
    off = prices.price(tokens(M, M), "deepseek-chat", base_url=url, started_at=night)
    assert_costs(peak, "1.37", "genai-prices 0.2.3 deepseek/deepseek-chat standard")
    assert_costs(off, "0.685", "genai-prices 0.2.3 deepseek/deepseek-chat standard")


def test_long_context_rates_apply_to_the_whole_prompt_past_the_threshold() -> None:
    # gpt-5.5: $5/$30 up to 272,000 prompt tokens; past it, $10/$45 for all tokens.
    at = price("gpt-5.5", tokens(272_000, 1000))
    assert_costs(at, "1.39", "genai-prices 0.2.3 openai/gpt-5.5 standard")  # 1.36 + 0.03
    past = price("gpt-5.5", tokens(272_001, 1000))
    assert_costs(past, "2.76501", "genai-prices 0.2.3 openai/gpt-5.5 standard >272000")
    # Cached tokens pay the long-context cached rate ($1) too: 200k x 10 + 100k x 1 + 10k x 45.
    cached = price("gpt-5.5", tokens(300_000, 10_000, cached=100_000))
    assert_costs(cached, "2.55", "genai-prices 0.2.3 openai/gpt-5.5 standard >272000")


def test_batch_results_get_batch_rates() -> None:
    found = price("gpt-5", tokens(M, M), batch=True)
    assert_costs(found, "5.625", "genai-prices 0.2.3 openai/gpt-5 batch")


def test_the_provider_is_the_upstream_s() -> None:
    usage = tokens(M, M)
    groq = "https://api.groq.com/openai/v1"
    # Groq's own price for its model; an OpenAI model at Groq is unknown there: unpriced.
    assert_costs(
        price("llama-3.1-8b-instant", usage, base_url=groq),
        "0.13",
        "genai-prices 0.2.3 groq/llama-3.1-8b-instant standard",
    )
    assert price("gpt-4o-mini", usage, base_url=groq) is None
    # Azure prices gpt-4o from OpenAI's list, without OpenAI's tiers (as genai-prices does).
    azure = "https://acme.openai.azure.com/openai/v1"
    found = price("gpt-4o", usage, base_url=azure, service_tier="priority")
    assert_costs(found, "12.5", "genai-prices 0.2.3 azure/gpt-4o standard")
    # A local gateway: the provider genai-prices finds by the model name, else OpenAI.
    local = "http://127.0.0.1:4000/v1"
    assert_costs(
        price("gpt-4o-mini", usage, base_url=local),
        "0.75",
        "genai-prices 0.2.3 openai/gpt-4o-mini standard",
    )
    assert_costs(
        price("text-embedding-3-small", tokens(M, 0), base_url=local),
        "0.02",
        "genai-prices 0.2.3 openai/text-embedding-3-small standard",
    )
    assert price("llama3.1:8b", usage, base_url=local) is None


def test_an_upstream_s_provider_setting_wins_over_its_url() -> None:
    prices = Prices(providers={"fast": "groq", "mine": "none"})
    local = "http://127.0.0.1:4000/v1"
    found = prices.price(tokens(M, M), "llama-3.1-8b-instant", upstream="fast", base_url=local)
    assert_costs(found, "0.13", "genai-prices 0.2.3 groq/llama-3.1-8b-instant standard")
    assert prices.price(tokens(M, M), "gpt-4o-mini", upstream="mine", base_url=OPENAI) is None
    with pytest.raises(ValueError, match=r"^upstreams\.x\.provider: unknown provider 'grok'"):
        Prices(providers={"x": "grok"})


def test_config_prices_win_for_their_models() -> None:
    prices = Prices({"gpt-5": {"input": 1, "output": 2}, "llama3": {"input": 0.5, "output": 0.5}})
    found = prices.price(tokens(M, M, cached=M // 2), "gpt-5-2025-08-07", base_url=OPENAI)
    assert found == (3.0, "config gpt-5")  # cached at `input` when no cached rate is given
    assert prices.price(tokens(M, M), "llama3:8b") == (1.0, "config llama3")
    assert prices.price(tokens(M, M), "llama3.1") is None  # "." is no boundary
    assert prices.price(tokens(M, M), "gpt-5.1", base_url=OPENAI) == (
        11.25, "genai-prices 0.2.3 openai/gpt-5.1 standard"
    )  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"m": {"input": "cheap", "output": 1}}, "prices.m.input"),
        ({"m": {"input": -1, "output": 1}}, "prices.m.input"),
        ({"m": {"input": 1}}, "prices.m.output"),
        ({"m": {"input": 1, "output": 1, "cached": 1}}, "prices.m.cached"),
        ({"m": 3}, "prices.m"),
    ],
)
def test_a_bad_config_price_names_its_key(overrides: Any, named: str) -> None:
    with pytest.raises(ValueError, match=rf"^{named}[.:]"):
        Prices(overrides)


@pytest.mark.parametrize("model", [None, "", "gpt-9", "gpt-5.9", "gpt-5-turbo"])
def test_an_unknown_model_is_unpriced_never_free(model: str | None) -> None:
    assert Prices().price(tokens(M, M), model, base_url=OPENAI) is None


def test_no_usage_is_unpriced_zero_usage_is_free() -> None:
    assert price("gpt-5", None) is None  # type: ignore[arg-type]
    assert price("gpt-5", tokens(0, 0)) == (0.0, "genai-prices 0.2.3 openai/gpt-5 standard")


def test_parts_overlapping_past_their_total_are_unpriced() -> None:
    # 8 cached and 8 audio tokens, none of them both, cannot fit in 10 input tokens.
    usage = tokens(10, 0, cached=8, input_audio=8)
    assert price("gpt-realtime", usage) is None


@pytest.fixture
def fresh_data() -> Iterator[None]:
    yield
    data_snapshot.set_custom_snapshot(None)


def test_fresh_data_replaces_what_was_looked_up(fresh_data: None) -> None:
    prices = Prices(live=True)
    before = prices.price(tokens(M, M), "gpt-5", base_url=OPENAI, started_at=NOW)
    assert before == (11.25, "genai-prices 0.2.3 openai/gpt-5 standard")
    cheaper = [p for p in providers if p.id == "openai"]
    model = next(m for m in cheaper[0].models if m.id == "gpt-5")
    kept = model.prices
    try:
        model.prices = ModelPrice(input_mtok=Decimal(1), output_mtok=Decimal(2))
        fetched = data_snapshot.DataSnapshot(cheaper, from_auto_update=True)
        fetched.timestamp = datetime(2026, 11, 27, 10, 5)
        data_snapshot.set_custom_snapshot(fetched)
        after = prices.price(tokens(M, M), "gpt-5", base_url=OPENAI, started_at=NOW)
    finally:
        model.prices = kept
    assert after is not None and after.cost_usd == 3.0
    stamp = fetched.timestamp.astimezone(UTC).strftime("%Y-%m-%dT%H:%MZ")
    assert after.source == f"genai-prices 0.2.3 data {stamp} openai/gpt-5 standard"


def _usages(rng: random.Random) -> Iterator[Usage]:
    for prompt in (0, 123, 271_999, 272_000, 272_001, 1_000_000):
        cached = rng.randint(0, prompt)
        audio = rng.randint(0, prompt - cached)
        cached_audio = rng.randint(0, min(cached, audio))
        write = rng.randint(0, prompt - cached - audio)
        output = rng.randint(0, 50_000)
        reasoning = rng.randint(0, output)
        out_audio = rng.randint(0, output - reasoning)
        yield Usage(
            prompt, cached, write, audio, cached_audio, 0, 0, output, reasoning, out_audio, 0
        )


def test_compiled_rates_give_genai_prices_own_figure_to_the_last_digit() -> None:
    """Every OpenAI, Anthropic and Google price, with every variant, on usages that reach
    every class and tier boundary: flightrec's integer arithmetic and genai-prices' own
    Decimal calculation agree exactly."""
    rng = random.Random(33)
    at = datetime.fromtimestamp(NOW, UTC)
    checked = 0
    for provider in providers:
        if provider.id not in ("openai", "anthropic", "google"):
            continue
        for model in provider.models:
            contexts = [None, *(v.when for v in model.price_variants or ())]
            for context in contexts:
                resolved = model.get_prices(at, context)
                rates = compile_rates(model_price_fields(resolved))
                for usage in _usages(rng):
                    given = dict(zip(CLASSES, usage, strict=False))
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        theirs = resolved.calc_price(GenaiUsage(**given))["total_price"]
                    found = rates.nanos_exact(usage)
                    assert found is not None
                    assert Decimal(found[0]) / Decimal(found[1]) == theirs, (model.id, usage)
                    checked += 1
    assert checked > 2000
