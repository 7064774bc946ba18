"""Retention on SQLite and PostgreSQL: `prune` deletes exchanges (or their bodies), and every
cost report (`cost_report`, `cost_series`) gives the same totals before, in the middle of and
after pruning, per model, key, user, tag, day and upstream, with every filter."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from proxy.config import ConfigError, load
from proxy.exchange import Exchange
from proxy.store import create_engine
from proxy.store import tables as t
from proxy.store.filters import Filters
from proxy.store.prune import Busy, plan, prune, pruning
from proxy.store.report import cost_report
from proxy.store.series import cost_series
from tests import dbs
from tests.dbs import chat_exchange, recorded

db_url = dbs.db_url  # fixture
pg_url = dbs.pg_url  # fixture

DAY0 = datetime(2026, 3, 1, tzinfo=UTC)
KEYS = [(None, None), ("sk-...aaaa", "a1" * 32), ("sk-...bbbb", "b2" * 32)]
TAGS: list[dict[str, str]] = [{}, {"team": "red"}, {"team": "blue", "env": "prod"}, {"env": "dev"}]
BYS = ["model", "key", "user", "day", "upstream", "tag:team", "tag:env"]
FILTERS = [
    Filters(),
    Filters(model="gpt-4o"),
    Filters(model="gpt-4o-mini-2024-07-18"),
    Filters(key="sk-...aaaa"),
    Filters(key="B2B2"),
    Filters(tags=(("team", "red"),)),
    Filters(tags=(("team", "blue"), ("env", "prod"))),
    Filters(since=DAY0 + timedelta(days=2)),
    Filters(until=DAY0 + timedelta(days=4)),
    Filters(since=DAY0 + timedelta(days=1), until=DAY0 + timedelta(days=3), model="gpt-4o"),
]


def usage(rng: random.Random) -> dict[str, Any]:
    prompt, completion = rng.randrange(1, 5000), rng.randrange(1, 900)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": rng.randrange(prompt)},
        "completion_tokens_details": {"reasoning_tokens": rng.randrange(completion)},
    }


def workload(count: int = 150, days: int = 6) -> list[Exchange]:
    """Exchanges over `days` days: priced, unpriced, failed, without usage; keys, users,
    tags and two upstreams; some with logprobs (rows that must go with their exchange)."""
    rng = random.Random(22)
    found = []
    for i in range(count):
        at = DAY0 + timedelta(days=i % days, seconds=rng.randrange(86400))
        model = rng.choice(["gpt-4o-mini", "gpt-4o", "house-model-9"])
        hint, digest = rng.choice(KEYS)
        ex = chat_exchange(
            started_at=at.timestamp(),
            model=model,
            user=rng.choice([None, "ann", "bob"]),
            key_hint=hint,
            key_hash=digest,
            tags=dict(rng.choice(TAGS)),
            logprobs=["a", "b", "c"] if i % 5 == 0 else None,
            upstream=rng.choice(["openai", "openai", "azure"]),
        )
        ex.usage = ex.response_json["usage"] = usage(rng)
        if i % 11 == 0:  # failed upstream: no usage, no cost, not unpriced
            ex.usage, ex.status, ex.outcome, ex.usage_source = None, 500, "upstream_error", None
            ex.response_json.pop("usage")
        elif i % 13 == 0:  # succeeded without usage: unpriced
            ex.usage, ex.usage_source = None, "missing"
            ex.response_json.pop("usage")
        found.append(ex)
    return found


async def reports(url: str) -> list[Any]:
    """Every grouping with every filter, and the daily series of each grouping."""
    engine = create_engine(url)
    try:
        found: list[Any] = []
        for by in BYS:
            for filters in FILTERS:
                found.append((by, filters, await cost_report(engine, by, filters)))
            found.append((by, "series", await cost_series(engine, by, "day")))
        return found
    finally:
        await engine.dispose()


async def count(url: str, table: sa.Table) -> int:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return int(await conn.scalar(sa.select(sa.func.count()).select_from(table)) or 0)
    finally:
        await engine.dispose()


async def prune_before(url: str, before: datetime, *, bodies: bool = False, batch: int = 7) -> int:
    engine = create_engine(url)
    try:
        async with pruning(engine) as conn:
            return (await prune(conn, before, bodies=bodies, batch=batch, pause=0)).count
    finally:
        await engine.dispose()


async def test_totals_are_the_same_before_during_and_after_pruning(db_url: str) -> None:
    exchanges = workload()
    await recorded(db_url, exchanges)
    before = await reports(db_url)
    assert any(row["cost_usd"] is None for _, _, rows in before[:1] for row in rows)  # unpriced

    # Half way through a day: the rest of that day stays as exchanges beside its rollup.
    cut = DAY0 + timedelta(days=2, hours=12)
    expected = sum(1 for ex in exchanges if ex.started_at < cut.timestamp())
    assert await prune_before(db_url, cut) == expected
    assert await count(db_url, t.exchanges) == len(exchanges) - expected
    assert 0 < await count(db_url, t.rollups) < expected
    assert await reports(db_url) == before

    assert await prune_before(db_url, DAY0 + timedelta(days=30)) == len(exchanges) - expected
    for table in (t.exchanges, t.tags, t.usage, t.choices, t.logprobs, t.completions):
        assert await count(db_url, table) == 0, table.name
    assert await reports(db_url) == before
    assert await prune_before(db_url, DAY0 + timedelta(days=30)) == 0  # nothing twice


async def test_a_range_inside_a_pruned_day_counts_the_day_whole(db_url: str) -> None:
    morning = chat_exchange(started_at=(DAY0 + timedelta(hours=6)).timestamp())
    evening = chat_exchange(started_at=(DAY0 + timedelta(hours=18)).timestamp())
    await recorded(db_url, [morning, evening])
    noon = DAY0 + timedelta(hours=12)
    engine = create_engine(db_url)

    async def requests(filters: Filters) -> int:
        return sum(row["requests"] for row in await cost_report(engine, "day", filters))

    try:
        assert await requests(Filters(since=noon)) == await requests(Filters(until=noon)) == 1
        assert await prune_before(db_url, DAY0 + timedelta(days=1)) == 2
        # A rollup stands at its day's midnight (UTC): in a range that holds the midnight.
        assert await requests(Filters(since=noon)) == 0
        assert await requests(Filters(until=noon)) == 2
        assert await requests(Filters(since=DAY0, until=DAY0 + timedelta(days=1))) == 2
        series = await cost_series(engine, "model", "hour")
        assert [p[0] for s in series["series"] for p in s["points"]] == [
            "2026-03-01T00:00:00+00:00"
        ]
    finally:
        await engine.dispose()


async def test_bodies_only_keeps_the_exchange_usage_tags_and_cost(db_url: str) -> None:
    exchanges = workload(40, days=2)
    await recorded(db_url, exchanges)
    before = await reports(db_url)
    cut = DAY0 + timedelta(days=1)
    old = {ex.id for ex in exchanges if ex.started_at < cut.timestamp()}
    logprobs = await count(db_url, t.logprobs)
    assert await prune_before(db_url, cut, bodies=True) == len(old)
    assert await prune_before(db_url, cut, bodies=True) == 0  # nothing left to strip

    assert await reports(db_url) == before
    assert await count(db_url, t.exchanges) == len(exchanges)
    assert await count(db_url, t.rollups) == 0
    assert 0 < await count(db_url, t.logprobs) < logprobs  # the kept day's stay
    engine = create_engine(db_url)
    try:
        async with engine.connect() as conn:
            ex = t.exchanges
            rows = (await conn.execute(sa.select(ex))).mappings().all()
            children = {
                table.name: set((await conn.execute(sa.select(table.c.exchange_id))).scalars())
                for table in (t.choices, t.logprobs, t.raw_streams, t.usage, t.tags)
            }
    finally:
        await engine.dispose()
    for row in rows:
        stripped = row["id"] in old
        bodies = [row[name] for name in ("request", "request_body", "response", "response_body")]
        assert (bodies == [None] * 4) == stripped
        assert row["request_omitted"] == row["response_omitted"] == stripped
    for name in ("choices", "logprobs"):
        assert not children[name] & old, name
    assert old & children["usage"] and old & children["tags"]


async def test_plan_counts_and_changes_nothing(db_url: str) -> None:
    exchanges = workload(30)
    await recorded(db_url, exchanges)
    cut = DAY0 + timedelta(days=3)
    engine = create_engine(db_url)
    try:
        async with pruning(engine) as conn:
            planned = await plan(conn, cut)
            stripped = await plan(conn, cut, bodies=True)
    finally:
        await engine.dispose()
    expected = sum(1 for ex in exchanges if ex.started_at < cut.timestamp())
    assert planned.exchanges == stripped.exchanges == expected
    oldest = min(ex.started_at for ex in exchanges)
    assert planned.oldest is not None
    assert planned.oldest.replace(tzinfo=UTC).timestamp() == pytest.approx(oldest, abs=1e-3)
    assert await count(db_url, t.exchanges) == len(exchanges)


async def test_one_pruner_at_a_time_on_postgresql(pg_url: str) -> None:
    await recorded(pg_url, workload(10))
    first, second = create_engine(pg_url), create_engine(pg_url)
    try:
        async with pruning(first):
            with pytest.raises(Busy, match="another flightrec is pruning"):
                async with pruning(second):
                    pass
        async with pruning(second) as conn:  # released with the first's session
            assert (await prune(conn, DAY0 + timedelta(days=30), pause=0)).count == 10
    finally:
        await first.dispose()
        await second.dispose()


async def test_sqlite_connections_enforce_foreign_keys(tmp_path: Any) -> None:
    engine = create_engine(dbs.sqlite_url(tmp_path / "fk.db"))
    try:
        async with engine.connect() as conn:
            assert (await conn.exec_driver_sql("PRAGMA foreign_keys")).scalar() == 1
    finally:
        await engine.dispose()


def test_bodies_retention_may_not_outlast_the_exchanges() -> None:
    env = {"FLIGHTREC_RETENTION_DAYS": "30", "FLIGHTREC_RETENTION_BODIES_DAYS": "90"}
    with pytest.raises(ConfigError, match=r"^retention_bodies_days: must not exceed"):
        load(env=env)
    assert load(env={**env, "FLIGHTREC_RETENTION_BODIES_DAYS": "7"}).retention_bodies_days == 7
    assert load(env={"FLIGHTREC_RETENTION_BODIES_DAYS": "7"}).retention_days == 0
    with pytest.raises(ConfigError, match=r"^FLIGHTREC_RETENTION_DAYS: expected an integer"):
        load(env={"FLIGHTREC_RETENTION_DAYS": "90d"})


async def test_two_pruners_racing_over_the_same_rows_count_each_once(db_url: str) -> None:
    """No lock between them (SQLite has none; on PostgreSQL neither takes it): each folds
    only what its own DELETE removed."""
    exchanges = workload(90)
    await recorded(db_url, exchanges)
    before = await reports(db_url)
    engines = [create_engine(db_url), create_engine(db_url)]
    cut = DAY0 + timedelta(days=30)

    async def one(engine: Any) -> int:
        async with pruning(engine, exclusive=False) as pruner:
            return (await prune(pruner, cut, batch=5, pause=0)).count

    try:
        counts = await asyncio.gather(*(one(engine) for engine in engines))
    finally:
        for engine in engines:
            await engine.dispose()
    assert sum(counts) == len(exchanges)
    assert await reports(db_url) == before
