"""The overview (`GET /api/overview`) on SQLite and PostgreSQL: its totals and top models are
what `flightrec cost` prints for the same range, to the last digit, read from the sums the
writer keeps (`facets`), and a batch the journal writes twice is counted once."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import orjson
import pytest

from proxy.exchange import Exchange
from proxy.sinks.settle import settle
from proxy.store import create_engine
from proxy.store.browse import ListFilters
from proxy.store.facets import percentile
from proxy.store.filters import Filters
from proxy.store.migrate import upgrade
from proxy.store.overview import overview, segments
from proxy.store.rows import rows_for
from proxy.store.writer import writer_for
from tests import dbs
from tests.cli.test_cli_store import cli
from tests.console_data import console_app
from tests.store.test_prune import prune_before

db_url = dbs.db_url  # fixture
HOUR = 3600.0


def traffic(now: float) -> list[Exchange]:
    """Five days of exchanges at odd minutes: priced and unpriced models, a failure, keys,
    users, tags, streams with a first token."""
    found = []
    for i in range(60):
        at = now - i * 2 * HOUR - 7 * 60 - i  # every two hours, off the hour
        model = ("gpt-4o-mini", "gpt-4o", "house-model-9")[i % 3]
        ex = dbs.chat_exchange(
            started_at=at,
            model=model,
            user=f"user-{i % 4}",
            key_hash=("a" if i % 2 else "b") * 64,
            key_hint="sk-...aaaa" if i % 2 else "sk-...bbbb",
            tags={"team": "red" if i % 5 else "blue"},
            duration_ms=100.0 + 40 * i,
            ttft_ms=30.0 + i if i % 2 else None,
        )
        if model == "gpt-4o":  # a snapshot genai-prices knows, as OpenAI answers
            ex.response_json["model"] = ex.response_model = "gpt-4o-2024-08-06"
            ex.response_body = orjson.dumps(ex.response_json)
        if i % 7 == 3:
            ex.status, ex.outcome, ex.error = 500, "upstream_error", "boom"
        found.append(ex)
    return found


async def write(url: str, exchanges: list[Exchange]) -> list[int]:
    """Two batches, then the first again, as the journal may replay it; how many were new.
    Each exchange is settled first, as `Sinks.accept` settles every exchange."""
    for ex in exchanges:
        settle(ex, dbs.PRICES)
    engine = create_engine(url)
    writer = writer_for(engine)
    batches = [exchanges[:25], exchanges[25:], exchanges[:25]]
    try:
        return [await writer.write([rows_for(ex) for ex in batch]) for batch in batches]
    finally:
        await writer.close()
        await engine.dispose()


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat()


async def cost(db: str, *args: str) -> list[dict[str, Any]]:
    run = await cli("cost", "--format", "json", *args, db_url=db)
    assert run.code == 0, run.err
    return list(json.loads(run.out))


def summed(rows: list[dict[str, Any]], name: str) -> Any:
    if name == "cost_usd":
        return sum((Decimal(str(r[name])) for r in rows if r[name] is not None), Decimal(0))
    return sum(r[name] for r in rows)


@pytest.mark.parametrize("window", ["all", "two days off the hour", "one hour inside"])
async def test_overview_totals_are_flightrec_cost(
    aiohttp_client: Any, db_url: str, window: str
) -> None:
    now = time.time()
    await upgrade(db_url)
    assert await write(db_url, traffic(now)) == [25, 35, 0]
    client = await aiohttp_client(console_app(db_url))
    ranges = {
        "all": [],
        "two days off the hour": ["--since", iso(now - 50 * HOUR - 1234)],
        "one hour inside": ["--since", iso(now - 30 * HOUR - 60), "--until", iso(now - 29 * HOUR)],
    }[window]
    query = dict(zip([a[2:] for a in ranges[::2]], ranges[1::2], strict=True))
    response = await client.get("/api/overview", params=query)
    assert response.status == 200, await response.text()
    found = await response.json()
    by_model = await cost(db_url, "--by", "model", *ranges)
    totals = found["totals"]
    for name in ("requests", "prompt_tokens", "completion_tokens", "unpriced_requests"):
        assert totals[name] == summed(by_model, name), name
    assert Decimal(str(totals["cost_usd"] or 0)) == summed(by_model, "cost_usd")
    assert sum(p[1] for p in found["points"]) == totals["requests"]
    top = {row["group"]: (row["requests"], row["cost_usd"]) for row in found["top"]["model"]}
    assert top == {row["group"]: (row["requests"], row["cost_usd"]) for row in by_model}
    by_key = await cost(db_url, "--by", "key", *ranges)
    keys = {row["group"]: row["requests"] for row in found["top"]["key"]}
    assert keys == {row["group"]: row["requests"] for row in by_key}


async def test_points_cover_the_range_with_empty_buckets(aiohttp_client: Any, db_url: str) -> None:
    now = time.time()
    await upgrade(db_url)
    await write(db_url, traffic(now))
    client = await aiohttp_client(console_app(db_url))
    since = iso(now - 10 * HOUR)
    found = await (await client.get("/api/overview", params={"since": since})).json()
    assert found["bucket"] == "hour"
    assert len(found["points"]) == 11  # the hour `since` falls in, to the current one
    counts = [p[1] for p in found["points"]]
    assert counts.count(0) == 6 and sum(counts) == 5  # one exchange every two hours
    assert found["totals"]["errors"] == 1  # i = 3 of 0..4
    week = await (await client.get("/api/overview", params={"since": "7d"})).json()
    assert week["bucket"] == "day" and len(week["points"]) == 8


async def test_filters_the_sums_answer_and_one_they_do_not(
    aiohttp_client: Any, db_url: str
) -> None:
    now = time.time()
    await upgrade(db_url)
    await write(db_url, traffic(now))
    client = await aiohttp_client(console_app(db_url))
    since = iso(now - 49 * HOUR - 77)
    for query, args in (
        ({"model": "gpt-4o"}, ["--model", "gpt-4o"]),
        ({"tag": "team=blue"}, ["--tag", "team=blue"]),
        ({"key": "sk-...aaaa"}, ["--key", "sk-...aaaa"]),
        ({"model": "gpt-4o", "tag": "team=red"}, ["--model", "gpt-4o", "--tag", "team=red"]),
    ):
        found = await (await client.get("/api/overview", params={**query, "since": since})).json()
        rows = await cost(db_url, "--since", since, *args)
        assert found["totals"]["requests"] == summed(rows, "requests"), query
        assert Decimal(str(found["totals"]["cost_usd"])) == summed(rows, "cost_usd"), query
    failed = await (await client.get("/api/overview", params={"outcome": "upstream_error"})).json()
    assert failed["totals"]["requests"] == failed["totals"]["errors"] == 9


def test_ragged_ends_are_read_from_the_exchanges() -> None:
    since = datetime(2026, 11, 20, 10, 15, tzinfo=UTC)
    until = datetime(2026, 11, 24, 8, 30, tzinfo=UTC)
    kinds = [(kind, lo.isoformat()[5:16], hi.isoformat()[5:16]) for kind, lo, hi in
             segments(since, until, "day")]  # fmt: skip
    assert kinds == [
        ("raw", "11-20T10:15", "11-20T11:00"),
        ("hour", "11-20T11:00", "11-21T00:00"),
        ("day", "11-21T00:00", "11-24T00:00"),
        ("hour", "11-24T00:00", "11-24T08:00"),
        ("raw", "11-24T08:00", "11-24T08:30"),
    ]


def test_percentiles_from_histogram_buckets() -> None:
    counts = [0] * 28
    counts[4] = 10  # 71-100 ms
    assert percentile(counts, 0.5) == pytest.approx((71 * 100) ** 0.5)
    assert percentile([0] * 28, 0.5) is None


async def test_sums_and_exchanges_give_the_same_overview(db_url: str) -> None:
    """Every exchange has fingerprint fp_test: adding that filter sends the same selection
    through the database's own sums of the exchanges instead of the writer's rows."""
    now = time.time()
    await upgrade(db_url)
    await write(db_url, traffic(now))
    engine = create_engine(db_url)
    until = datetime.fromtimestamp(now, UTC)
    try:
        for since in (until - timedelta(hours=50, seconds=1234), until - timedelta(days=6)):
            for base in (Filters(since, until), Filters(since, until, model="gpt-4o")):
                from_sums = await overview(engine, ListFilters(base))
                from_rows = await overview(engine, ListFilters(base, fingerprint="fp_test"))
                assert from_sums == from_rows
                assert from_sums["totals"]["p50_ms"] is not None
    finally:
        await engine.dispose()


async def test_cost_chart_axis_is_the_filter_and_pruned_days_are_marked(
    aiohttp_client: Any, db_url: str
) -> None:
    now = time.time()
    await upgrade(db_url)
    exchanges = traffic(now)
    await write(db_url, exchanges)
    before = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    boundary = before - timedelta(days=3)
    await prune_before(db_url, boundary)  # the exchanges of 4 days ago and before
    # Five days back from now reach one or two days before the boundary, by the time of day.
    pruned_days = {
        datetime.fromtimestamp(ex.started_at, UTC).date()
        for ex in exchanges
        if ex.started_at < boundary.timestamp()
    }
    assert len(pruned_days) in (1, 2)
    client = await aiohttp_client(console_app(db_url))
    page = await (await client.get("/cost", params={"since": "10d"})).text()
    spend = page[page.index("Spend (USD) per day") : page.index("Tokens (prompt")]
    assert spend.count('class="hover"') == 11  # 10 days back and today, data or not
    assert spend.count('class="pruned"') == len(pruned_days)  # the days whose exchanges went
    assert "Pruned days" in page
    # The overview's sums outlive the exchanges: its totals are still the cost report's.
    found = await (await client.get("/api/overview")).json()
    rows = await cost(db_url, "--by", "model")
    assert found["totals"]["requests"] == summed(rows, "requests") == 60
