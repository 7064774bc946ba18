"""Prices made ready for the record's path: a price list compiled into whole-number rates.

genai-prices states a model's price as `ModelPrice`: a Decimal per unit (per 1M tokens, per
1K requests, ...), some tiered by the prompt's length, and each more specific token class
(cached input, cached audio input, reasoning output, ...) priced apart from the class it is
part of. Its own calculation takes each priced class's "leaf" count (the class's count less
its priced sub-classes' leaves) times the class's price. That arithmetic is linear, so
`compile_rates` folds it once per price into one integer coefficient per `Usage` class for
each band of prompt length; pricing an exchange is then a few integer products and one
division, the same amount genai-prices computes, exact.

Only token classes `Usage` reports, and the per-request fee, can have a count here; every
other unit a price names (searches, pages, hours) counts 0, as it does in genai-prices when
the usage does not report it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from genai_prices.data_units import unit_data
from genai_prices.types import TieredPrices

from proxy.usage import Usage

CLASSES = (
    "input_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "input_audio_tokens",
    "cache_audio_read_tokens",
    "input_image_tokens",
    "cache_image_read_tokens",
    "output_tokens",
    "output_reasoning_tokens",
    "output_audio_tokens",
    "output_image_tokens",
)
"""genai-prices' usage keys of `Usage`'s first fields, in `Usage`'s order."""
_REQUESTS = "requests"
_PER_TOKENS = 1_000_000
_PER_REQUESTS = 1_000
_TOKEN_UNITS = {
    str(unit.get("price_key", key)): key
    for key, unit in unit_data.items()
    if unit.get("dimensions", {}).get("family") == "tokens" and unit.get("per") == _PER_TOKENS
}
"""Price key to usage key of every token unit genai-prices knows."""
_DIMENSIONS = {
    key: frozenset(unit.get("dimensions", {}).items()) for key, unit in unit_data.items()
}

Price = Decimal | TieredPrices


@dataclass(frozen=True, slots=True)
class Band:
    """The rates for prompts longer than `above` input tokens (up to the next band)."""

    above: int
    terms: tuple[tuple[int, int], ...]
    """(index into `Usage`, coefficient) for each class whose coefficient is not 0."""
    fee: int
    """The per-request fee, in the same units as the coefficients."""
    leaves: tuple[tuple[tuple[int, int], ...], ...]
    """The leaf counts, as (index, coefficient) terms, that take two or more parts from one
    total (input less its cached and its audio tokens, ...): usage whose parts overlap past
    that total makes one negative. A leaf that takes one part cannot be: a decoded part is
    never more than its whole."""


@dataclass(frozen=True, slots=True)
class Rates:
    """One price list ready to apply: bands by prompt length, longest first."""

    bands: tuple[Band, ...]
    divisor: int
    """Coefficients are USD times `divisor` per token (per request for the fee)."""

    def nanos_exact(self, usage: Usage) -> tuple[int, int] | None:
        """(amount, divisor): the cost is amount / divisor USD exactly; None when the usage's
        parts overlap past their totals, which no price can apply to."""
        amount = self._amount(usage)
        return None if amount is None else (amount, self.divisor)

    def cost(self, usage: Usage) -> float | None:
        """USD for `usage`: the float nearest the exact amount (one integer division)."""
        amount = self._amount(usage)
        return None if amount is None else amount / self.divisor

    def _amount(self, usage: Usage) -> int | None:
        bands = self.bands
        band = bands[0]
        if len(bands) > 1:
            count = usage.input
            for band in bands:
                if count > band.above:
                    break
        for leaf in band.leaves:
            if sum((usage[i] or 0) * k for i, k in leaf) < 0:
                return None
        total = band.fee
        for index, coefficient in band.terms:
            total += (usage[index] or 0) * coefficient
        return total


def _places(value: Decimal) -> int:
    return max(0, -int(value.as_tuple().exponent))


def _priced(prices: Mapping[str, Any]) -> dict[str, Price]:
    """Usage key to price, for token units and the request fee; other units are left out."""
    found: dict[str, Price] = {}
    for key, value in prices.items():
        if value is None:
            continue
        if key == "requests_kcount":
            found[_REQUESTS] = value
        elif key in _TOKEN_UNITS:
            found[_TOKEN_UNITS[key]] = value
    return found


def _at(price: Price, above: int) -> Decimal:
    """The price that applies to prompts longer than `above` tokens ("cliff" tiers: the
    whole prompt pays the highest tier it passes)."""
    if not isinstance(price, TieredPrices):
        return price
    applied = price.base
    for tier in price.tiers:
        if above >= tier.start:
            applied = tier.price
    return applied


def _leaves(priced: Iterable[str]) -> dict[str, dict[str, int]]:
    """Each priced token class's leaf count as coefficients over `CLASSES` (genai-prices'
    rule: most specific first, each less its priced sub-classes' leaves)."""
    units = sorted(priced, key=lambda key: (-len(_DIMENSIONS[key]), key))
    leaves: dict[str, dict[str, int]] = {}
    for unit in units:
        leaf = {unit: 1} if unit in CLASSES else {}
        for other, other_leaf in leaves.items():
            if _DIMENSIONS[unit] <= _DIMENSIONS[other]:
                for key, k in other_leaf.items():
                    leaf[key] = leaf.get(key, 0) - k
        leaves[unit] = leaf
    return leaves


def compile_rates(prices: Mapping[str, Any]) -> Rates:
    """`Rates` for a price list of genai-prices price keys (`input_mtok`, ...) to Decimal or
    `TieredPrices` values."""
    priced = _priced(prices)
    starts = sorted(
        {t.start for p in priced.values() if isinstance(p, TieredPrices) for t in p.tiers}
    )
    bounds = [*reversed(starts), -1]
    values = [_at(p, b) for p in priced.values() for b in bounds]
    places = max((_places(v) for v in values), default=0)
    divisor = 10**places * _PER_TOKENS
    tokens = [key for key in priced if key != _REQUESTS]
    leaves = _leaves(tokens)
    bands = []
    for above in bounds:
        fee = 0
        if _REQUESTS in priced:
            fee = int(_at(priced[_REQUESTS], above).scaleb(places)) * (_PER_TOKENS // _PER_REQUESTS)
        coefficients = dict.fromkeys(CLASSES, 0)
        for unit in tokens:
            rate = int(_at(priced[unit], above).scaleb(places))
            for key, k in leaves[unit].items():
                coefficients[key] += rate * k
        terms = tuple((i, coefficients[key]) for i, key in enumerate(CLASSES) if coefficients[key])
        checks = tuple(
            tuple((CLASSES.index(key), k) for key, k in leaf.items() if k)
            for leaf in leaves.values()
            if sum(k < 0 for k in leaf.values()) > 1
        )
        bands.append(Band(max(above, -1), terms, fee, checks))
    return Rates(tuple(bands), divisor)


def model_price_fields(model_price: Any) -> dict[str, Any]:
    """A genai-prices `ModelPrice`'s price keys and values (it keeps them as attributes)."""
    return {k: v for k, v in vars(model_price).items() if not k.startswith("_")}
