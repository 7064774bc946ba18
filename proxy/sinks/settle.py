"""An exchange's figures, settled once when it completes: its usage decoded, its price.

`Sinks.accept` settles every exchange before any sink sees it (and before `Keep` takes out
what the record may not keep, so an omitted response is still priced). Rows, metrics, traces
and, through the stored rows, the console read the figures set here and nothing else.
"""

from __future__ import annotations

from typing import Any

from proxy.exchange import Exchange
from proxy.pricing import Prices
from proxy.usage import decode_usage


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def settle(exchange: Exchange, prices: Prices) -> None:
    """Set the exchange's `tokens`, `service_tier`, `response_model`, `cost_usd` and
    `price_entry` from its usage and response. Never raises on odd shapes."""
    response = exchange.response_json if isinstance(exchange.response_json, dict) else {}
    usage = exchange.usage if isinstance(exchange.usage, dict) else response.get("usage")
    exchange.tokens = tokens = decode_usage(usage)
    # `_text` written out for the usual case (a text already set, or none in the response).
    tier = exchange.service_tier
    if type(tier) is not str or not tier:
        exchange.service_tier = _text(tier) or _text(response.get("service_tier"))
    model = exchange.response_model
    if type(model) is not str or not model:
        exchange.response_model = _text(model) or _text(response.get("model"))
    priced = prices.price(
        tokens,
        exchange.model_name,
        upstream=exchange.upstream,
        base_url=exchange.upstream_url,
        service_tier=exchange.service_tier,
        started_at=exchange.started_at,
        batch=exchange.batch,
    )
    if priced is None:
        exchange.cost_usd = exchange.price_entry = None
    else:
        exchange.cost_usd, exchange.price_entry = priced
