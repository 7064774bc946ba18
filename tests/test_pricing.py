"""Pricing: hand-computed costs for every usage shape, lookup rules, config, the shipped table.

Expected costs are written as the arithmetic a reader can check (tokens x USD per 1M tokens,
divided by 1M), never by calling the code under test.
"""

from __future__ import annotations

import math
import re
import tomllib
from datetime import date
from fractions import Fraction
from importlib import resources
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.pricing import Price, PriceTable, Tokens, cost_of, normalize_usage

TABLE = PriceTable.load()
M = 1_000_000


def cost(model: str | None, usage: Any) -> float | None:
    return TABLE.cost(model, usage)[0]


def chat(prompt: int, completion: int, **details: int) -> dict[str, Any]:
    """A chat/completions usage object; details go where the API puts them."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {
            "cached_tokens": details.get("cached", 0),
            "audio_tokens": details.get("audio_prompt", 0),
        },
        "completion_tokens_details": {
            "reasoning_tokens": details.get("reasoning", 0),
            "audio_tokens": details.get("audio_completion", 0),
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


# --- costs ------------------------------------------------------------------------------


def test_cached_prompt_tokens_are_billed_at_the_cached_price() -> None:
    # gpt-4o-mini: input 0.15, cached 0.075, output 0.60
    usage = chat(1000, 500, cached=400)
    assert cost("gpt-4o-mini", usage) == pytest.approx((600 * 0.15 + 400 * 0.075 + 500 * 0.60) / M)
    assert cost("gpt-4o-mini", usage) == pytest.approx(0.00042, abs=1e-12)


def test_reasoning_tokens_are_part_of_completion_never_added_twice() -> None:
    # o3: input 2.00, output 8.00; 2500 of the 3000 completion tokens were reasoning
    with_reasoning = chat(2000, 3000, reasoning=2500)
    assert cost("o3", with_reasoning) == pytest.approx((2000 * 2.00 + 3000 * 8.00) / M)
    assert cost("o3", with_reasoning) == pytest.approx(0.028, abs=1e-12)
    assert cost("o3", with_reasoning) == cost("o3", chat(2000, 3000))


def test_a_dated_snapshot_is_priced_by_the_longest_matching_key() -> None:
    cost_usd, entry = TABLE.cost("gpt-4o-mini-2024-07-18", chat(1_000_000, 0))
    assert entry is not None and entry.key == "gpt-4o-mini"
    assert cost_usd == pytest.approx(0.15, abs=1e-12)  # not gpt-4o's 2.50


def test_gpt_4o_2024_05_13_keeps_its_launch_price_later_snapshots_do_not() -> None:
    usage = chat(1000, 1000)
    old, old_entry = TABLE.cost("gpt-4o-2024-05-13", usage)
    new, new_entry = TABLE.cost("gpt-4o-2024-08-06", usage)
    assert old_entry is not None and old_entry.key == "gpt-4o-2024-05-13"
    assert new_entry is not None and new_entry.key == "gpt-4o"
    assert old == pytest.approx((1000 * 5.00 + 1000 * 15.00) / M, abs=1e-12)  # 0.02
    assert new == pytest.approx((1000 * 2.50 + 1000 * 10.00) / M, abs=1e-12)  # 0.0125


def test_cached_tokens_without_a_cached_price_are_billed_at_input() -> None:
    # gpt-4o-2024-05-13 publishes no cached price
    assert cost("gpt-4o-2024-05-13", chat(1000, 0, cached=600)) == pytest.approx(
        1000 * 5.00 / M, abs=1e-12
    )


def test_embeddings_bill_prompt_tokens_only() -> None:
    usage = {"prompt_tokens": 12_345, "total_tokens": 12_345}
    assert cost("text-embedding-3-small", usage) == pytest.approx(12_345 * 0.02 / M, abs=1e-12)
    assert cost("text-embedding-3-large", usage) == pytest.approx(12_345 * 0.13 / M, abs=1e-12)
    assert cost("text-embedding-ada-002", usage) == pytest.approx(12_345 * 0.10 / M, abs=1e-12)


def test_responses_api_usage_shape() -> None:
    usage = {
        "input_tokens": 5000,
        "input_tokens_details": {"cached_tokens": 3000},
        "output_tokens": 800,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 5800,
    }
    # gpt-4.1: input 2.00, cached 0.50, output 8.00
    expected = (2000 * 2.00 + 3000 * 0.50 + 800 * 8.00) / M  # 0.0119
    assert cost("gpt-4.1-2025-04-14", usage) == pytest.approx(expected, abs=1e-12)


def test_responses_api_reasoning_tokens_are_inside_output_tokens() -> None:
    usage = {
        "input_tokens": 1200,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 900,
        "output_tokens_details": {"reasoning_tokens": 700},
    }
    # o4-mini: input 1.10, output 4.40
    assert cost("o4-mini", usage) == pytest.approx((1200 * 1.10 + 900 * 4.40) / M, abs=1e-12)


def test_audio_tokens_are_priced_at_audio_rates_and_taken_out_of_text() -> None:
    # gpt-4o-audio-preview: text 2.50 / 10.00, audio 40.00 / 80.00
    usage = chat(1500, 600, audio_prompt=1000, audio_completion=400)
    expected = (500 * 2.50 + 1000 * 40.00 + 200 * 10.00 + 400 * 80.00) / M  # 0.07525
    assert cost("gpt-4o-audio-preview-2025-06-03", usage) == pytest.approx(expected, abs=1e-12)


def test_audio_tokens_are_text_for_an_entry_without_audio_rates() -> None:
    usage = chat(1500, 600, audio_prompt=1000, audio_completion=400)
    assert cost("gpt-4o", usage) == pytest.approx((1500 * 2.50 + 600 * 10.00) / M, abs=1e-12)


def test_cached_tokens_count_as_text_even_when_audio_was_reported() -> None:
    # gpt-4o-realtime-preview: text 5.00, cached 2.50, audio in 40.00. 300 cached, and of the
    # 900 audio tokens only the 700 uncached prompt tokens can be audio.
    usage = chat(1000, 0, cached=300, audio_prompt=900)
    assert cost("gpt-4o-realtime-preview", usage) == pytest.approx(
        (300 * 2.50 + 700 * 40.00) / M, abs=1e-12
    )


def test_transcription_usage_shape() -> None:
    usage = {
        "type": "tokens",
        "input_tokens": 100,
        "input_token_details": {"text_tokens": 20, "audio_tokens": 80},
        "output_tokens": 50,
        "total_tokens": 150,
    }
    # gpt-4o-mini-transcribe: text in 1.25, audio in 3.00, output 5.00
    expected = (20 * 1.25 + 80 * 3.00 + 50 * 5.00) / M
    assert cost("gpt-4o-mini-transcribe", usage) == pytest.approx(expected, abs=1e-12)


def test_the_sum_is_exact_then_rounded_once() -> None:
    # 3 x 0.10 in binary floating point is 0.30000000000000004; the table's 0.10 is exact.
    assert 3 * 0.10 / M != 3e-7
    assert cost("gpt-4.1-nano", {"prompt_tokens": 3}) == 3e-7
    # gpt-4o-mini: 6 x 0.15 + 1 x 0.075 + 3 x 0.60 = 2.775 per 1M tokens
    assert cost("gpt-4o-mini", chat(7, 3, cached=1)) == 2.775e-6


def test_cost_of_clamps_tokens_built_by_hand() -> None:
    price = Price(key="k", input=1.0, cached_input=0.5, output=2.0)
    over = Tokens(
        prompt=10, cached=50, completion=0, reasoning=0, audio_prompt=0, audio_completion=0
    )
    assert cost_of(price, over) == pytest.approx(10 * 0.5 / M, abs=1e-15)


_rates = st.one_of(
    st.floats(min_value=0, max_value=1e6, allow_nan=False),
    st.decimals(min_value=0, max_value=1000, places=6).map(float),
    st.sampled_from([0.0, 1e-300, 5e-324, 1e300, 0.1 + 0.2]),
)


@given(
    st.tuples(_rates, st.none() | _rates, _rates, st.none() | _rates, st.none() | _rates),
    st.integers(0, 10**12),
    st.integers(0, 10**12),
    st.integers(0, 10**12),
    st.integers(0, 10**12),
    st.integers(0, 10**12),
)
def test_a_cost_is_the_float_nearest_the_exact_amount(
    rates: tuple[float, float | None, float, float | None, float | None],
    prompt: int,
    completion: int,
    cached: int,
    audio_in: int,
    audio_out: int,
) -> None:
    """Against exact fractions of the rates as written (their shortest repr)."""
    price = Price("k", *rates)
    cached, audio_in, audio_out = (
        min(cached, prompt),
        min(audio_in, prompt),
        min(audio_out, completion),
    )
    audio_in = min(audio_in, prompt - cached) if price.audio_input is not None else 0
    audio_out = audio_out if price.audio_output is not None else 0
    tokens = Tokens(prompt, cached, completion, 0, audio_in, audio_out)

    def exact(rate: float | None) -> Fraction:
        return Fraction(repr(rate))

    cached_rate = price.input if price.cached_input is None else price.cached_input
    amount = (
        (prompt - cached - audio_in) * exact(price.input)
        + cached * exact(cached_rate)
        + (completion - audio_out) * exact(price.output)
        + (audio_in * exact(price.audio_input) if audio_in else 0)
        + (audio_out * exact(price.audio_output) if audio_out else 0)
    )
    assert cost_of(price, tokens) == float(amount / M)


# --- unknown model, missing usage -------------------------------------------------------


@pytest.mark.parametrize("model", ["no-such-model", "", None, "GPT-4O", "gpt-5.2", "gpt-4o1"])
def test_an_unknown_model_gets_no_cost_and_no_entry(model: str | None) -> None:
    assert TABLE.cost(model, chat(10, 10)) == (None, None)


@pytest.mark.parametrize(
    "usage", [None, {}, {"total_tokens": 5}, {"prompt_tokens": None}, "garbage", [1, 2]]
)
def test_missing_or_unknown_usage_gets_no_cost(usage: Any) -> None:
    assert normalize_usage(usage) is None
    assert TABLE.cost("gpt-4o", usage) == (None, None)


def test_zero_usage_is_a_real_zero_cost() -> None:
    assert TABLE.cost("gpt-4o", chat(0, 0))[0] == 0.0


# --- lookup -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "key"),
    [
        ("gpt-4o", "gpt-4o"),
        ("gpt-4o-2024-11-20", "gpt-4o"),
        ("gpt-4o-mini-audio-preview-2024-12-17", "gpt-4o-mini-audio-preview"),
        ("gpt-4o-audio-preview-2024-10-01", "gpt-4o-audio-preview-2024-10-01"),
        ("gpt-4-0613", "gpt-4"),
        ("gpt-4-turbo-2024-04-09", "gpt-4-turbo"),
        ("gpt-4-0125-preview", "gpt-4-0125-preview"),
        ("gpt-3.5-turbo-0125", "gpt-3.5-turbo"),
        ("gpt-3.5-turbo-16k-0613", "gpt-3.5-turbo-16k"),
        ("o1-preview", "o1"),
        ("o3-mini-2025-01-31", "o3-mini"),
        ("o3-2025-04-16", "o3"),
        ("gpt-5-2025-08-07", "gpt-5"),
        ("gpt-5-mini-2025-08-07", "gpt-5-mini"),
        ("gpt-4.1-mini-2025-04-14", "gpt-4.1-mini"),
    ],
)
def test_lookup_exact_or_longest_key(model: str, key: str) -> None:
    entry = TABLE.lookup(model)
    assert entry is not None and entry.key == key


def test_a_key_must_be_followed_by_a_separator_to_match() -> None:
    # "gpt-4" is a prefix of all of these, but none is a gpt-4 snapshot
    assert TABLE.lookup("gpt-4.5-preview-2025-02-27") is not None  # its own entry
    assert TABLE.lookup("gpt-4x") is None
    assert TABLE.lookup("gpt-5.1") is None
    table = PriceTable.load({"acme": {"input": 1, "output": 1}, "ft:": {"input": 1, "output": 1}})
    for model, key in [("acme:7b", "acme"), ("acme@2025", "acme"), ("ft:gpt-4o:org::x", "ft:")]:
        entry = table.lookup(model)
        assert entry is not None and entry.key == key


# --- config -----------------------------------------------------------------------------


def test_config_overrides_some_fields_of_a_shipped_entry_and_adds_a_model() -> None:
    table = PriceTable.load(
        {"gpt-4o": {"input": 2.0, "note": "negotiated"}, "my-model": {"input": 1, "output": 3}}
    )
    gpt_4o = table.lookup("gpt-4o-2024-08-06")
    assert gpt_4o == Price(
        key="gpt-4o",
        input=2.0,
        cached_input=1.25,  # kept from the shipped entry
        output=10.00,
        source="table:2026-11-22+config",
    )
    usage = chat(1000, 1000, cached=200)
    assert table.cost("gpt-4o", usage)[0] == pytest.approx(
        (800 * 2.0 + 200 * 1.25 + 1000 * 10.00) / M, abs=1e-12
    )
    cost_usd, entry = table.cost("my-model-v2", usage)
    assert entry is not None and (entry.key, entry.source) == ("my-model", "config")
    assert entry.cached_input is None
    assert cost_usd == pytest.approx((1000 * 1 + 1000 * 3) / M, abs=1e-12)
    # the shipped table itself is untouched
    shipped = PriceTable.load().lookup("gpt-4o")
    assert shipped is not None and shipped.input == 2.50 and shipped == TABLE.lookup("gpt-4o")


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"gpt-4o": {"input": "cheap"}}, "prices.gpt-4o.input"),
        ({"gpt-4o": {"output": -1}}, "prices.gpt-4o.output"),
        ({"gpt-4o": {"cached_input": True}}, "prices.gpt-4o.cached_input"),
        ({"gpt-4o": {"audio_input": math.nan}}, "prices.gpt-4o.audio_input"),
        ({"gpt-4o": {"audio_output": math.inf}}, "prices.gpt-4o.audio_output"),
        ({"gpt-4o": {"ouput": 1}}, "prices.gpt-4o.ouput"),
        ({"gpt-4o": {"source": "mine"}}, "prices.gpt-4o.source"),
        ({"new-model": {"input": 1}}, "prices.new-model.output"),
        ({"new-model": {"output": 1}}, "prices.new-model.input"),
        ({"new-model": 3}, "prices.new-model"),
    ],
)
def test_a_bad_config_value_names_its_key(overrides: Any, named: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(named) + ":"):
        PriceTable.load(overrides)


# --- the shipped table ------------------------------------------------------------------


def test_every_shipped_entry_has_source_date_and_non_negative_prices() -> None:
    raw = tomllib.loads(resources.files("proxy").joinpath("prices.toml").read_text("utf-8"))
    assert isinstance(raw["meta"]["compiled"], date)
    assert raw["models"], "the table is empty"
    for key, fields in raw["models"].items():
        assert str(fields["source"]).startswith("https://"), key
        assert isinstance(fields["date"], date), key
        assert fields["date"] <= raw["meta"]["compiled"], key
        assert fields.get("note"), f"{key}: say whether the price was confirmed"
        for name in ("input", "cached_input", "output", "audio_input", "audio_output"):
            if name in fields:
                assert fields[name] >= 0, (key, name)
        assert "input" in fields and "output" in fields, key
        assert fields.get("cached_input", fields["input"]) <= fields["input"], key
        assert fields.get("audio_input", fields["input"]) >= fields["input"], key
        assert fields.get("audio_output", fields["output"]) >= fields["output"], key
    assert set(TABLE.entries) == set(raw["models"])
    for key, entry in TABLE.entries.items():
        assert entry.key == key and entry.source == f"table:{raw['models'][key]['date']}"


def test_the_models_the_contract_names_are_in_the_table() -> None:
    required = [
        *("gpt-5", "gpt-5-mini", "gpt-5-nano", "gpt-5-chat-latest"),
        *("gpt-4.1", "gpt-4.1-mini", "gpt-4.1-nano"),
        *("gpt-4o", "gpt-4o-2024-05-13", "gpt-4o-mini"),
        *("gpt-4o-audio-preview", "gpt-4o-mini-audio-preview"),
        *("o1", "o1-mini", "o1-pro", "o3", "o3-mini", "o3-pro", "o4-mini"),
        *("gpt-3.5-turbo", "gpt-4-turbo", "gpt-4"),
        *("text-embedding-3-small", "text-embedding-3-large", "text-embedding-ada-002"),
    ]
    assert [model for model in required if model not in TABLE.entries] == []
    assert all(TABLE.entries[m].audio_input is not None for m in required if "audio" in m)


# --- normalisation ----------------------------------------------------------------------


def test_normalize_chat_usage_with_every_detail() -> None:
    usage = chat(100, 50, cached=30, audio_prompt=20, reasoning=10, audio_completion=5)
    assert normalize_usage(usage) == Tokens(100, 30, 50, 10, 20, 5)


def test_normalize_clamps_details_to_their_totals() -> None:
    usage = chat(100, 50, cached=150, audio_prompt=300, reasoning=60, audio_completion=70)
    assert normalize_usage(usage) == Tokens(100, 100, 50, 50, 100, 50)


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"prompt_tokens": 10, "completion_tokens": None}, Tokens(10, 0, 0, 0, 0, 0)),
        ({"prompt_tokens": 10, "prompt_tokens_details": None}, Tokens(10, 0, 0, 0, 0, 0)),
        ({"prompt_tokens": 10.0, "completion_tokens": 2}, Tokens(10, 0, 2, 0, 0, 0)),
        ({"prompt_tokens": 10, "prompt_tokens_details": [1]}, Tokens(10, 0, 0, 0, 0, 0)),
        (
            {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": "5"}},
            Tokens(10, 0, 0, 0, 0, 0),
        ),
        ({"prompt_tokens": -1}, None),
        ({"prompt_tokens": True, "completion_tokens": 3}, None),
        ({"prompt_tokens": 1.5}, None),
        ({"prompt_tokens": "10"}, None),
        ({"prompt_tokens": None, "input_tokens": 7, "output_tokens": 1}, Tokens(7, 0, 1, 0, 0, 0)),
    ],
)
def test_normalize_is_robust_to_nulls_and_garbage(usage: Any, expected: Tokens | None) -> None:
    assert normalize_usage(usage) == expected


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)
_keys = st.sampled_from(
    ["prompt_tokens", "completion_tokens", "input_tokens", "output_tokens",
     "prompt_tokens_details", "completion_tokens_details", "input_tokens_details",
     "output_tokens_details", "cached_tokens", "audio_tokens", "reasoning_tokens"]
)  # fmt: skip


@given(st.dictionaries(_keys, _json | st.dictionaries(_keys, _json, max_size=4), max_size=6))
def test_normalize_never_raises_and_keeps_details_within_totals(usage: dict[str, Any]) -> None:
    tokens = normalize_usage(usage)
    if tokens is not None:
        assert 0 <= tokens.cached <= tokens.prompt and 0 <= tokens.audio_prompt <= tokens.prompt
        assert 0 <= tokens.reasoning <= tokens.completion
        assert 0 <= tokens.audio_completion <= tokens.completion
        assert TABLE.cost("gpt-4o-audio-preview", usage)[0] is not None


# --- properties -------------------------------------------------------------------------

_models = st.sampled_from(sorted(TABLE.entries))
_n = st.integers(min_value=0, max_value=10**7)
_FIELDS = ("prompt", "cached", "completion", "reasoning", "audio_prompt", "audio_completion")


def _usage(counts: dict[str, int]) -> dict[str, Any]:
    return chat(
        counts["prompt"],
        counts["completion"],
        cached=counts["cached"],
        reasoning=counts["reasoning"],
        audio_prompt=counts["audio_prompt"],
        audio_completion=counts["audio_completion"],
    )


@given(_models, st.fixed_dictionaries(dict.fromkeys(_FIELDS, _n)), st.sampled_from(_FIELDS), _n)
def test_cost_is_monotone_in_each_token_count(
    model: str, counts: dict[str, int], field: str, extra: int
) -> None:
    # Holds because every entry has cached_input <= input <= audio_input and
    # output <= audio_output (checked on the shipped table above).
    before = cost(model, _usage(counts))
    after = cost(model, _usage({**counts, field: counts[field] + extra}))
    assert before is not None and after is not None and before >= 0
    if field == "reasoning":
        assert after == before  # already inside completion
    elif field == "cached":
        assert after <= before  # cached tokens are a cheaper part of the prompt
    else:
        assert after >= before


@given(_models, _n, _n, _n)
def test_more_cached_than_prompt_is_clamped(model: str, prompt: int, over: int, out: int) -> None:
    clamped = cost(model, chat(prompt, out, cached=prompt))
    assert cost(model, chat(prompt, out, cached=prompt + over)) == clamped
    entry = TABLE.entries[model]
    rate = entry.input if entry.cached_input is None else entry.cached_input
    assert clamped == pytest.approx((prompt * rate + out * entry.output) / M, rel=1e-12)
