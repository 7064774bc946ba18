"""What an exchange cost: the dated price table, usage normalised across endpoints, the sum.

`proxy/prices.toml` ships with the package (USD per 1M tokens, each entry dated and sourced);
config `[prices."<model>"]` tables override or add entries. The recorder asks
`PriceTable.cost(model, usage)` once per exchange and stores both the cost and the entry
that produced it; `flightrec cost --reprice` asks again with today's table. An unknown model
or missing usage gets no cost at all (None), never a silent 0, so reports can count it as
unpriced.

Pure: no I/O besides reading the shipped table once, at first use.

Decisions the contract leaves open:

- A model matches its entry exactly, else the longest key that the model name continues with
  "-", ":" or "@" ("gpt-4o-mini" prices "gpt-4o-mini-2024-07-18"). A bare prefix is not
  enough, because "gpt-5" would then price "gpt-5.2" and "gpt-4" would price "gpt-4.5-preview"
  at another model's rates; such names stay unpriced until the table or config has them.
- A config entry for a model the shipped table has (same key) overrides only the fields it
  gives; for any other model it is a new entry and must give `input` and `output`.
- Usage that reports more cached (or audio, or reasoning) tokens than the total they are part
  of is clamped to that total: the cost then never exceeds what the reported totals allow.
- Audio tokens are priced at the entry's audio rates and taken out of the text counts only
  when the entry has those rates; cached tokens are always billed as cached text.
- Each product is an integer times the decimal price as written, summed exactly and divided
  once, so a cost is the correctly rounded float of the exact amount.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any, NamedTuple, TypeGuard

_RATES = ("input", "cached_input", "output", "audio_input", "audio_output")
_TABLE_FIELDS = frozenset({*_RATES, "source", "date", "note"})
_CONFIG_FIELDS = frozenset({*_RATES, "note"})
# What may follow a key in a model name for the key to price it: OpenAI dates its snapshots
# with "-", other servers tag models with ":" (llama3:8b) or "@" (model@2024-05-13).
_BOUNDARY = ("-", ":", "@")
_LOOKUPS_KEPT = 4096
"""Distinct model names a price table remembers its lookups for before starting over."""


@dataclass(frozen=True, slots=True)
class Price:
    """One entry of the table, in USD per 1M tokens."""

    key: str
    """The table key that matched, e.g. "gpt-4o-mini" for "gpt-4o-mini-2024-07-18"."""
    input: float
    """Uncached prompt tokens."""
    cached_input: float | None
    """Cached prompt tokens; None when none is published (they are then billed at `input`)."""
    output: float
    """Completion tokens, reasoning tokens included."""
    audio_input: float | None = None
    audio_output: float | None = None
    source: str = ""
    """Where the entry came from: "table:<date read>", "config", or "table:<date>+config"."""
    exact: ExactRates = field(init=False, repr=False, compare=False)
    """The rates as written, as integers (`cost_of` sums in them)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "exact", ExactRates.of(self))


class ExactRates(NamedTuple):
    """A price's rates exactly as written in the table, as integers at one decimal place:
    rate == value / 10**places. `cost_of` sums in integers and divides once."""

    input: int
    cached_input: int
    """The input rate when no cached rate is published."""
    output: int
    audio_input: int
    audio_output: int
    divisor: int
    """10**(places + 6): the places, and the rates being per 1M tokens."""

    @classmethod
    def of(cls, price: Price) -> ExactRates:
        cached = price.input if price.cached_input is None else price.cached_input
        rates = (price.input, cached, price.output, price.audio_input, price.audio_output)
        written = [_written(rate or 0.0) for rate in rates]
        places = max(p for _, p in written)
        at_input, at_cached, at_output, at_audio_in, at_audio_out = [
            digits * 10 ** (places - p) for digits, p in written
        ]
        return cls(at_input, at_cached, at_output, at_audio_in, at_audio_out, 10 ** (places + 6))


class Tokens(NamedTuple):
    """Usage normalised across endpoints; every detail count is at most the total it is in.

    A named tuple, not a frozen dataclass: the recorder makes one per exchange, and a named
    tuple is the cheapest immutable record to build (docs/performance.md)."""

    prompt: int
    """All prompt (input) tokens, cached and audio included."""
    cached: int
    completion: int
    """All completion (output) tokens, reasoning and audio included."""
    reasoning: int
    audio_prompt: int
    audio_completion: int


def _count(value: Any) -> int | None:
    """A token count as sent, or None unless it is a non-negative whole number."""
    if type(value) is int:  # nearly always
        return value if value >= 0 else None
    if isinstance(value, bool):  # bool is an int subclass; True is no count
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and value >= 0:
        return int(value)
    return None


def _is_mapping(value: Any) -> TypeGuard[Mapping[str, Any]]:
    # `isinstance(x, Mapping)` goes through the ABC machinery; JSON gives plain dicts.
    return type(value) is dict or (value is not None and isinstance(value, Mapping))


def _detail(usage: Mapping[str, Any], tables: tuple[str, ...], name: str) -> int:
    for table in tables:
        details = usage.get(table)
        if _is_mapping(details):
            found = _count(details.get(name))
            if found is not None:
                return found
    return 0


def normalize_usage(usage: Mapping[str, Any] | None) -> Tokens | None:
    """Tokens from a usage object of chat/completions, embeddings, or the Responses API.

    None when there is no usage or its shape is unknown; never raises on garbage.
    """
    if not _is_mapping(usage):
        return None
    prompt = _count(usage.get("prompt_tokens"))
    if prompt is not None:  # chat/completions, legacy completions, embeddings
        completion = _count(usage.get("completion_tokens")) or 0
        # Each details table read once, the tuple built by position: the recorder prices
        # every exchange, so this lookup is on every record's path.
        cached = audio_prompt = reasoning = audio_completion = 0
        inputs = usage.get("prompt_tokens_details")
        if _is_mapping(inputs):
            cached = min(_count(inputs.get("cached_tokens")) or 0, prompt)
            audio_prompt = min(_count(inputs.get("audio_tokens")) or 0, prompt)
        outputs = usage.get("completion_tokens_details")
        if _is_mapping(outputs):
            reasoning = min(_count(outputs.get("reasoning_tokens")) or 0, completion)
            audio_completion = min(_count(outputs.get("audio_tokens")) or 0, completion)
        return Tokens(prompt, cached, completion, reasoning, audio_prompt, audio_completion)
    # Responses API; the Realtime and transcription shapes say "token_details"
    prompt = _count(usage.get("input_tokens"))
    if prompt is None:
        return None
    completion = _count(usage.get("output_tokens")) or 0
    ins = ("input_tokens_details", "input_token_details")
    outs = ("output_tokens_details", "output_token_details")
    return Tokens(
        prompt=prompt,
        cached=min(_detail(usage, ins, "cached_tokens"), prompt),
        completion=completion,
        reasoning=min(_detail(usage, outs, "reasoning_tokens"), completion),
        audio_prompt=min(_detail(usage, ins, "audio_tokens"), prompt),
        audio_completion=min(_detail(usage, outs, "audio_tokens"), completion),
    )


def _written(rate: float) -> tuple[int, int]:
    """(digits, places) with rate == digits / 10**places: the price as written in the table.
    repr is the shortest string that reads back as the same float ("0.075" gives (75, 3)),
    whereas the float itself carries a binary approximation."""
    written = Decimal(repr(rate))
    places = max(0, -int(written.as_tuple().exponent))
    return int(written.scaleb(places)), places


def cost_of(price: Price, tokens: Tokens) -> float:
    """USD for `tokens` at `price`, exact up to one final rounding to float.

    Summed in integers (`ExactRates`) and divided once: Python's int division rounds
    correctly, so this is the float nearest the exact amount, as the `Decimal` sum it
    replaces was, in a third of the time."""
    cached = min(tokens.cached, tokens.prompt)
    audio_in = 0
    if price.audio_input is not None:
        audio_in = min(tokens.audio_prompt, tokens.prompt - cached)
    audio_out = 0
    if price.audio_output is not None:
        audio_out = min(tokens.audio_completion, tokens.completion)
    rates = price.exact
    total = (tokens.prompt - cached - audio_in) * rates.input + (
        tokens.completion - audio_out
    ) * rates.output
    # Terms for tokens that are not there are skipped: most exchanges have none of them.
    if cached:
        total += cached * rates.cached_input
    if audio_in:
        total += audio_in * rates.audio_input
    if audio_out:
        total += audio_out * rates.audio_output
    return total / rates.divisor


def _rate(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}: expected a price in USD per 1M tokens, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{where}: expected a non-negative price, got {value!r}")
    return float(value)


def _entry(
    where: str, key: str, fields: Any, allowed: frozenset[str], base: Price | None, source: str
) -> Price:
    """One entry from a TOML table; `base` supplies the fields it leaves out."""
    if not isinstance(fields, Mapping):
        raise ValueError(f"{where}: expected a table of prices, got {fields!r}")
    for name in fields:
        if name not in allowed:
            raise ValueError(f"{where}.{name}: unknown field (known: {', '.join(sorted(allowed))})")
    rates: dict[str, float | None] = {
        name: _rate(f"{where}.{name}", fields[name])
        if name in fields
        else (None if base is None else getattr(base, name))
        for name in _RATES
    }
    input_rate, output_rate = rates["input"], rates["output"]
    if input_rate is None:
        raise ValueError(f"{where}.input: required for a model the shipped table does not have")
    if output_rate is None:
        raise ValueError(f"{where}.output: required for a model the shipped table does not have")
    return Price(
        key=key,
        input=input_rate,
        cached_input=rates["cached_input"],
        output=output_rate,
        audio_input=rates["audio_input"],
        audio_output=rates["audio_output"],
        source=source,
    )


def _iso(where: str, value: Any) -> str:
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, str):
        try:
            return date.fromisoformat(value).isoformat()
        except ValueError:
            pass
    raise ValueError(f"{where}: expected an ISO date, got {value!r}")


@cache
def _shipped() -> tuple[Mapping[str, Price], str]:
    """The packaged table, parsed once; read through importlib so it works from a wheel."""
    text = resources.files("proxy").joinpath("prices.toml").read_text(encoding="utf-8")
    raw = tomllib.loads(text)
    compiled = _iso("prices.toml: meta.compiled", raw.get("meta", {}).get("compiled"))
    entries: dict[str, Price] = {}
    for key, fields in raw.get("models", {}).items():
        where = f"prices.toml: models.{key}"
        if not isinstance(fields, Mapping) or not fields.get("source"):
            raise ValueError(f"{where}.source: every shipped entry names its source")
        read = _iso(f"{where}.date", fields.get("date"))
        entries[key] = _entry(where, key, fields, _TABLE_FIELDS, None, f"table:{read}")
    return MappingProxyType(entries), compiled


class PriceTable:
    """The shipped table plus config entries, and the lookup and cost built on them."""

    __slots__ = ("_entries", "_found", "_lengths", "compiled")

    def __init__(self, entries: Mapping[str, Price], compiled: str) -> None:
        self._entries = dict(entries)
        self._lengths = sorted({len(key) for key in self._entries}, reverse=True)
        self._found: dict[str, Price | None] = {}
        """Lookups made, by model name: a recorder asks about the same few models all day."""
        self.compiled = compiled
        """The date the shipped table was compiled (ISO)."""

    @classmethod
    def load(cls, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> PriceTable:
        """The shipped table with config entries applied (see the module docstring).

        Raises ValueError naming `prices.<model>.<field>` for a bad config value.
        """
        shipped, compiled = _shipped()
        entries = dict(shipped)
        for model, fields in (overrides or {}).items():
            if not isinstance(model, str) or not model:
                raise ValueError(f"prices: expected model names, got {model!r}")
            base = shipped.get(model)
            source = "config" if base is None else f"{base.source}+config"
            entries[model] = _entry(f"prices.{model}", model, fields, _CONFIG_FIELDS, base, source)
        return cls(entries, compiled)

    @property
    def entries(self) -> Mapping[str, Price]:
        """Every entry by key, read-only."""
        return MappingProxyType(self._entries)

    def lookup(self, model: str | None) -> Price | None:
        """The entry for `model`: exact, else the longest key it continues (case-sensitive)."""
        if not isinstance(model, str) or not model:
            return None
        try:
            return self._found[model]
        except KeyError:
            pass
        if len(self._found) >= _LOOKUPS_KEPT:
            self._found.clear()
        found = self._found[model] = self._search(model)
        return found

    def _search(self, model: str) -> Price | None:
        exact = self._entries.get(model)
        if exact is not None:
            return exact
        for length in self._lengths:
            # A key that itself ends in a separator ("ft:") matches whatever follows it.
            if length < len(model) and (
                model[length] in _BOUNDARY or model[length - 1] in _BOUNDARY
            ):
                found = self._entries.get(model[:length])
                if found is not None:
                    return found
        return None

    def cost(
        self, model: str | None, usage: Mapping[str, Any] | None
    ) -> tuple[float | None, Price | None]:
        """(USD, entry) for one exchange; (None, None) for an unknown model or missing usage."""
        price = self.lookup(model)
        tokens = normalize_usage(usage)
        if price is None or tokens is None:
            return None, None
        return cost_of(price, tokens), price


@cache
def shipped_prices() -> PriceTable:
    """The price table as shipped, for callers that have no config."""
    return PriceTable.load()


def price_entry(price: Price) -> str:
    """What `exchanges.price_entry` holds: the key and where its rates came from."""
    return f"{price.key} ({price.source})"


def cost_for(
    prices: PriceTable, model: str | None, response_model: str | None, usage: Any
) -> tuple[float | None, str | None]:
    """(`cost_usd`, `price_entry`) of one exchange; (None, None) when it cannot be priced.

    The model that answered (`response_model`) is priced; the requested one only when the
    response names none. A response model the table does not know stays unpriced rather than
    being billed at the rates of the model that was asked for.
    """
    cost, price = prices.cost(response_model or model, usage)
    if cost is None or price is None:
        return None, None
    return cost, price_entry(price)
