"""The overview's folded runs (`store.folds`): its top lists over weeks read a few folded rows
per value, and still equal `flightrec cost` on both engines: across a month's end, over
pruned days, after an exchange is written late into a folded day, and when the database
refuses the folded rows."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import sqlalchemy as sa

from proxy.console.state import CONSOLE
from proxy.exchange import Exchange
from proxy.sinks.settle import settle
from proxy.store import create_engine, folds
from proxy.store import tables as t
from proxy.store.browse import ListFilters
from proxy.store.filters import Filters
from proxy.store.migrate import upgrade
from proxy.store.overview import overview
from proxy.store.rows import rows_for
from proxy.store.writer import writer_for
from tests import dbs
from tests.console.test_overview import cost, summed
from tests.console_data import console_app
from tests.store.test_prune import prune_before

db_url = dbs.db_url  # fixture
FIRST = datetime(2026, 9, 20, 3, 11, tzinfo=UTC)
MODELS = ("gpt-4o-mini", "gpt-4o", "house-model-9")


def traffic(count: int = 130) -> list[Exchange]:
    """An exchange every 7 hours and a few minutes from 20 September to late October:
    priced and unpriced models, keys, users, tags, a failure now and then."""
    found = []
    for i in range(count):
        at = FIRST + timedelta(hours=7 * i, minutes=i % 50)
        found.append(exchange(at, i))
    return found


def exchange(at: datetime, i: int, user: str | None = None) -> Exchange:
    ex = dbs.chat_exchange(
        started_at=at.timestamp(),
        model=MODELS[i % 3],
        user=user or f"user-{i % 5}",
        key_hash=("a" if i % 2 else "b") * 64,
        key_hint="sk-...aaaa" if i % 2 else "sk-...bbbb",
        tags={"team": "red" if i % 5 else "blue"},
        duration_ms=100.0 + 10 * i,
    )
    if i % 7 == 3:
        ex.status, ex.outcome, ex.error = 500, "upstream_error", "boom"
    return ex


async def write(url: str, exchanges: list[Exchange]) -> None:
    for ex in exchanges:
        settle(ex, dbs.PRICES)
    engine = create_engine(url)
    writer = writer_for(engine)
    try:
        for start in range(0, len(exchanges), 40):
            await writer.write([rows_for(ex) for ex in exchanges[start : start + 40]])
    finally:
        await writer.close()
        await engine.dispose()


def iso(at: datetime) -> str:
    return at.isoformat()


async def agrees_with_cost(url: str, since: datetime, until: datetime) -> dict[str, Any]:
    """The overview of [since, until) (no filter: its top lists come from the facet rows),
    checked against `flightrec cost` by model, key, user and tag."""
    engine = create_engine(url)
    try:
        found = await overview(engine, ListFilters(Filters(since, until)))
    finally:
        await engine.dispose()
    window = ["--since", iso(since), "--until", iso(until)]
    by_model = await cost(url, "--by", "model", *window)
    assert found["totals"]["requests"] == summed(by_model, "requests")
    for dim, by in (("model", "model"), ("key", "key"), ("user", "user"), ("tag", "tag:team")):
        rows = await cost(url, "--by", by, *window)
        if dim == "tag":
            rows = [{**row, "group": f"team={row['group']}"} for row in rows]
        want = {row["group"]: (row["requests"], row["cost_usd"]) for row in rows}
        assert {r["group"]: (r["requests"], r["cost_usd"]) for r in found["top"][dim]} == want
    return found


async def folded_rows(url: str) -> dict[str, int]:
    """Requests in the folded `all` rows per folded span."""
    engine = create_engine(url)
    f = t.facets
    query = (
        sa.select(f.c.span, sa.func.sum(f.c.requests))
        .where(f.c.dim == "all", f.c.span.in_(folds.LEVELS))
        .group_by(f.c.span)
    )
    try:
        async with engine.connect() as conn:
            return {span: int(n) for span, n in await conn.execute(query)}
    finally:
        await engine.dispose()


def test_a_range_is_cut_into_few_aligned_runs() -> None:
    lo = folds.index(datetime(2026, 8, 30, tzinfo=UTC), "day")
    runs = folds.tiles("day", lo, lo + 89)
    assert sum(length for _, length in runs) == 89
    assert all(first % length == 0 for first, length in runs)
    assert all(a + n == b for (a, n), (b, _) in pairwise(runs))
    assert len(runs) <= 12
    # Runs of hours stay inside their day (8 divides 24).
    hours = folds.tiles("hour", folds.index(datetime(2026, 8, 29, 10, tzinfo=UTC), "hour"),
                        folds.index(datetime(2026, 8, 30, tzinfo=UTC), "hour"))  # fmt: skip
    assert [length for _, length in hours] == [2, 4, 8]


def test_a_run_is_read_folded_only_while_it_matches_its_days() -> None:
    day = [1, 0, 100, 1, 0]  # requests, errors, cost_nano, priced, unpriced
    present = {i: day for i in range(64, 72) if i != 69}  # day 69 had no exchange
    current = {("d4", 64): [4, 0, 400, 4, 0], ("d4", 68): [4, 0, 400, 4, 0]}
    read, stale = folds.plan("day", 64, 72, present, current, ended=100)
    # 68-71 holds 3 days of exchanges now: its folded row is stale, read from its days.
    assert read == [("d4", 64, 4), ("day", 68, 1), ("day", 70, 1), ("day", 71, 1)]
    assert [unit for unit, _ in stale] == [("d8", 64, 8)]  # the whole run, folded from `read`
    assert stale[0][1] == read
    # A run that has not ended is read from its parts and not folded.
    assert folds.plan("day", 64, 72, present, current, ended=71)[1] == []


async def test_top_lists_across_a_month_end_and_pruned_days(db_url: str) -> None:
    await upgrade(db_url)
    exchanges = traffic()
    await write(db_url, exchanges)
    await prune_before(db_url, datetime(2026, 9, 26, tzinfo=UTC))  # 20-25 September
    # Pruned days are counted by day (their rollups): a range starts on one at midnight.
    since, until = datetime(2026, 9, 21, tzinfo=UTC), datetime(2026, 10, 24, 13, 41, tzinfo=UTC)
    found = await agrees_with_cost(db_url, since, until)
    assert found["totals"]["requests"] > 100
    before = await folded_rows(db_url)
    assert before and before.keys() <= set(folds.LEVELS)
    # Read again from the folded rows, the same answer.
    assert await agrees_with_cost(db_url, since, until) == found
    assert await folded_rows(db_url) == before
    # An exchange written late into a folded day (a journal replayed): the run no longer
    # matches its days, is read from them, and is folded again.
    await write(db_url, [exchange(datetime(2026, 10, 2, 12, 30, tzinfo=UTC), 1, user="late")])
    found = await agrees_with_cost(db_url, since, until)
    assert any(row["group"] == "late" for row in found["top"]["user"])
    assert sum((await folded_rows(db_url)).values()) > sum(before.values())
    # Ragged at both ends, a whole month, and every day from the first.
    await agrees_with_cost(db_url, datetime(2026, 9, 27, 5, 17, tzinfo=UTC), until)
    await agrees_with_cost(
        db_url, datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)
    )
    await agrees_with_cost(
        db_url, datetime(2026, 9, 20, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)
    )


async def test_a_database_that_refuses_the_folded_rows_is_read_from_the_days(
    tmp_path: Any,
) -> None:
    url = dbs.sqlite_url(tmp_path / "flightrec.db")
    await upgrade(url)
    await write(url, traffic())
    since, until = (
        datetime(2026, 9, 21, 5, 17, tzinfo=UTC),
        datetime(2026, 10, 24, 13, 41, tzinfo=UTC),
    )
    other = sqlite3.connect(tmp_path / "flightrec.db")
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock past the busy timeout
    engine = create_engine(url, busy_timeout_ms=20)
    try:
        locked = await overview(engine, ListFilters(Filters(since, until)))
    finally:
        await engine.dispose()
        other.rollback()
        other.close()
    assert await folded_rows(url) == {}
    assert locked == await agrees_with_cost(url, since, until)  # folds now, same answer
    assert await folded_rows(url) != {}


async def test_the_console_answers_without_writing_and_folds_in_the_background(
    aiohttp_client: Any, db_url: str
) -> None:
    await upgrade(db_url)
    await write(db_url, traffic())
    since, until = datetime(2026, 9, 21, tzinfo=UTC), datetime(2026, 10, 24, 13, 41, tzinfo=UTC)
    # Given somewhere to put them, the overview hands over the runs to fold and writes nothing.
    handed: list[Any] = []
    engine = create_engine(db_url)
    try:
        direct = await overview(
            engine, ListFilters(Filters(since, until)), fold_later=handed.append
        )
    finally:
        await engine.dispose()
    assert handed and all(stale for stale in handed)
    assert await folded_rows(db_url) == {}
    assert direct == await agrees_with_cost(db_url, since, until)  # folds inline
    await clear_folds(db_url)
    # The console's API does the same, then folds after answering.
    app = console_app(db_url)
    client = await aiohttp_client(app)
    query = {"since": iso(since), "until": iso(until)}
    first = await client.get("/api/overview", params=query)
    assert first.status == 200, await first.text()
    folding = app[CONSOLE].folding
    assert folding is not None
    assert await folding > 0
    assert await folded_rows(db_url) != {}
    again = await client.get("/api/overview", params=query)
    assert await again.json() == await first.json()
    assert app[CONSOLE].folding is folding  # nothing left to fold


async def clear_folds(url: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.delete(t.facets).where(t.facets.c.span.in_(folds.LEVELS)))
    finally:
        await engine.dispose()


async def test_a_long_history_with_gaps_is_read_in_a_few_selects(tmp_path: Any) -> None:
    """1,040 days with exchanges every other day, nothing folded yet: the top lists read the
    days as a few ranges (SQLite refuses a UNION of more than 500 SELECTs)."""
    url = dbs.sqlite_url(tmp_path / "flightrec.db")
    await upgrade(url)
    first = datetime(2023, 6, 1, tzinfo=UTC)
    rows = []
    for i in range(520):
        at = first + timedelta(days=2 * i)
        for dim, value in (("all", ""), ("model", "gpt-4o")):
            for span, begins in (("day", at), ("hour", at + timedelta(hours=5))):
                sums = dict.fromkeys(t.FACET_SUMS, 0) | {"requests": 1}
                rows.append({"dim": dim, "span": span, "start": begins, "value": value, **sums})
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(t.facets.insert(), rows)
        handed: list[Any] = []
        found = await overview(engine, ListFilters(), fold_later=handed.append)
    finally:
        await engine.dispose()
    assert found["totals"]["requests"] == 520
    assert [(row["group"], row["requests"]) for row in found["top"]["model"]] == [("gpt-4o", 520)]
    assert handed and await folded_rows(url) == {}


async def test_a_refused_fold_is_not_asked_again_at_once(tmp_path: Any) -> None:
    """The console's background fold against a database that refuses it (another writer
    holds SQLite's lock): the overview still answers from the days, and the fold is not tried
    again on every request, only after `FOLD_RETRY`."""
    from proxy.config import Config
    from proxy.console import templates
    from proxy.console.state import FOLD_RETRY, Console

    url = dbs.sqlite_url(tmp_path / "flightrec.db")
    await upgrade(url)
    await write(url, traffic())
    since, until = datetime(2026, 9, 21, tzinfo=UTC), datetime(2026, 10, 24, 13, 41, tzinfo=UTC)
    filters = ListFilters(Filters(since, until))
    other = sqlite3.connect(tmp_path / "flightrec.db")
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock past the busy timeout
    engine = create_engine(url, busy_timeout_ms=20)
    console = Console(Config(), templates(), engine=engine)
    try:
        found = await overview(engine, filters, fold_later=console.fold_later)
        refused = console.folding
        assert refused is not None and await refused == 0
        assert console.fold_refused_at is not None
        assert await overview(engine, filters, fold_later=console.fold_later) == found
        assert console.folding is refused  # not tried again
        other.rollback()
        console.fold_refused_at -= FOLD_RETRY
        assert await overview(engine, filters, fold_later=console.fold_later) == found
        assert console.folding is not refused and await console.folding > 0
        assert console.fold_refused_at is None
    finally:
        await console.stop_folding()
        await engine.dispose()
        other.close()
    assert await folded_rows(url) != {}
    assert found == await agrees_with_cost(url, since, until)
