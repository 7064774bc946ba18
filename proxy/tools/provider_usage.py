"""The provider's own figures for a period: OpenAI's Costs and Usage APIs, read with an admin key.

- `GET /organization/costs?group_by=line_item`: daily buckets of results, each an
  `amount.value` (USD) for a `line_item` such as `"gpt-5-2025-08-07, input"`. The model is the
  line item's text before its first ", "; a line item without one (a tool's fee, storage) is
  its own row.
- `GET /organization/usage/completions?group_by=model` and `/usage/embeddings`: daily buckets
  of `num_model_requests`, `input_tokens` (cached included), `input_cached_tokens`,
  `output_tokens` per model.

Both page with `has_more` and `next_page` (passed back as `page`). The admin key goes in the
`Authorization` header of these requests only; it is never logged, stored or put in an error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import aiohttp

PATHS = {
    "costs": "/organization/costs",
    "completions": "/organization/usage/completions",
    "embeddings": "/organization/usage/embeddings",
}
LIMITS = {"costs": 180, "completions": 31, "embeddings": 31}
"""The most daily buckets a page may hold, as the API reference gives them."""
GROUP_BY = {"costs": "line_item", "completions": "model", "embeddings": "model"}
MAX_PAGES = 1000
"""A provider that keeps saying `has_more` is not believed forever."""


class ProviderError(Exception):
    """The provider's report could not be read; one line, never the key."""


@dataclass(slots=True)
class ProviderDay:
    requests: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    cost: Decimal | None = None
    """USD as the Costs API said it (summed exactly); None when it said nothing."""


Days = dict[tuple[str, str], ProviderDay]


def _day(start: Any) -> str:
    if not isinstance(start, int | float) or isinstance(start, bool):
        raise ProviderError(f"a bucket without a start_time: {start!r}")
    return datetime.fromtimestamp(start, UTC).date().isoformat()


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def line_item_model(line_item: Any) -> str:
    """The model a Costs API line item is for ("gpt-5, input" -> "gpt-5")."""
    if not isinstance(line_item, str) or not line_item:
        return ""
    return line_item.split(", ", 1)[0]


async def _pages(
    session: aiohttp.ClientSession, base_url: str, kind: str, params: dict[str, Any]
) -> AsyncIterator[dict[str, Any]]:
    """Each bucket of the report, page after page."""
    page: str | None = None
    for _ in range(MAX_PAGES):
        query = params | {"limit": LIMITS[kind], "group_by": GROUP_BY[kind]}
        if page is not None:
            query["page"] = page
        body = await _get(session, base_url + PATHS[kind], query)
        data = body.get("data")
        if not isinstance(data, list):
            raise ProviderError(f"{PATHS[kind]}: the answer has no list of buckets")
        for bucket in data:
            if isinstance(bucket, dict):
                yield bucket
        page = body.get("next_page")
        if not body.get("has_more") or not isinstance(page, str):
            return
    raise ProviderError(f"{PATHS[kind]}: more than {MAX_PAGES} pages")


async def _get(session: aiohttp.ClientSession, url: str, query: dict[str, Any]) -> dict[str, Any]:
    try:
        async with session.get(url, params=query) as response:
            body = await response.json(content_type=None)
            if response.status != 200:
                raise ProviderError(f"{url}: {response.status} {_message(body)}")
    except aiohttp.ClientError as exc:
        raise ProviderError(f"{url}: {type(exc).__name__}: {exc}") from None
    except ValueError:
        raise ProviderError(f"{url}: the answer is not JSON") from None
    if not isinstance(body, dict):
        raise ProviderError(f"{url}: the answer is not a JSON object")
    return body


def _message(body: Any) -> str:
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else "(no error message)"


async def provider_days(
    base_url: str, admin_key: str, since: datetime, until: datetime, *, seconds: float = 60
) -> Days:
    """The provider's figures per (UTC day, model) for [since, until)."""
    params = {
        "start_time": int(since.timestamp()),
        "end_time": int(until.timestamp()),
        "bucket_width": "1d",
    }
    days: Days = {}
    headers = {"Authorization": f"Bearer {admin_key}"}
    client = aiohttp.ClientTimeout(total=seconds)
    async with aiohttp.ClientSession(headers=headers, timeout=client) as session:
        for kind in ("completions", "embeddings"):
            async for bucket in _pages(session, base_url, kind, params):
                _add_usage(days, bucket)
        async for bucket in _pages(session, base_url, "costs", params):
            _add_costs(days, bucket)
    return days


def _results(bucket: dict[str, Any]) -> list[dict[str, Any]]:
    found = bucket.get("results", bucket.get("result"))
    return [r for r in found if isinstance(r, dict)] if isinstance(found, list) else []


def _add_usage(days: Days, bucket: dict[str, Any]) -> None:
    day = _day(bucket.get("start_time"))
    for result in _results(bucket):
        model = result.get("model")
        into = days.setdefault((day, model if isinstance(model, str) else ""), ProviderDay())
        into.requests += _count(result.get("num_model_requests"))
        into.input_tokens += _count(result.get("input_tokens"))
        into.cached_tokens += _count(result.get("input_cached_tokens"))
        into.output_tokens += _count(result.get("output_tokens"))


def _add_costs(days: Days, bucket: dict[str, Any]) -> None:
    day = _day(bucket.get("start_time"))
    for result in _results(bucket):
        amount = result.get("amount")
        value = amount.get("value") if isinstance(amount, dict) else None
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            continue
        try:
            cost = Decimal(str(value))
        except ArithmeticError:
            raise ProviderError(f"a cost that is not a number: {value!r}") from None
        into = days.setdefault((day, line_item_model(result.get("line_item"))), ProviderDay())
        into.cost = cost if into.cost is None else into.cost + cost
