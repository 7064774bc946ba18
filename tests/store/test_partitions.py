"""PostgreSQL partitions (migration 0010, `proxy/store/partitions.py`): an existing database
with data converted and back, rows in their day's partition, and retention that folds whole
days into the rollups and drops them while every cost report stays the same."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from proxy.exchange import Exchange, format_id
from proxy.store import create_engine, partitions, rollups
from proxy.store import tables as t
from proxy.store.filters import Filters
from proxy.store.migrate import downgrade, upgrade
from proxy.store.report import cost_report
from proxy.store.series import cost_series
from tests import dbs
from tests.dbs import chat_exchange, store
from tests.faultkit import Serve, upstream_process
from tests.store.test_prune import BYS, prune_before, workload
from tests.store.test_recorder import query

pg_url = dbs.pg_url  # fixture

TODAY = datetime.now(UTC).date()
BEFORE = "0011"
"""The revision migration 0010 follows."""
TABLES = ("exchanges", "tags", "completions", "choices", "usage", "logprobs", "raw_streams")


def midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def minted_at(ex: Exchange, at: datetime) -> Exchange:
    """`ex` as if it had come at `at`: its start and its id (the id's millisecond is its
    start, as the proxy mints them)."""
    ex.started_at = at.timestamp()
    ex.id = format_id(int(at.timestamp() * 1000) << 12)
    return ex


async def counts(url: str) -> dict[str, int]:
    found = {}
    for table in TABLES:
        ((count,),) = await query(url, f'SELECT count(*) FROM "{table}"')
        found[table] = count
    return found


async def where_rows_are(url: str, table: str) -> dict[str, int]:
    found = await query(url, f'SELECT tableoid::regclass::text, count(*) FROM "{table}" GROUP BY 1')
    return dict(found)


def test_a_day_bound_is_the_lowest_id_of_that_day() -> None:
    day = date(2026, 11, 27)
    first = midnight(day)
    assert partitions.bound(day) == "01a21a4d-4000-0000-0000-000000000000"
    assert partitions.bound(day) < format_id(int(first.timestamp() * 1000) << 12)
    last = format_id((int(first.timestamp() * 1000) - 1) << 12 | 0xFFF)
    assert last < partitions.bound(day)
    assert partitions.day_of(last) == day - timedelta(days=1)
    assert partitions.day_of("not-a-uuid-at-all") is None


async def test_an_existing_database_is_converted_with_its_rows_and_back(pg_url: str) -> None:
    await upgrade(pg_url, BEFORE)
    exchanges = [
        minted_at(chat_exchange(logprobs=["a", "b"], tags={"team": "red"}), midnight(day))
        for day in (TODAY - timedelta(days=3), TODAY - timedelta(days=1), TODAY)
    ]
    legacy = chat_exchange(logprobs=["c"])
    legacy.id = "legacy-0001"  # not a UUIDv7: its rows go to DEFAULT
    exchanges.append(legacy)
    assert await store(pg_url, exchanges) == 4
    before = await counts(pg_url)
    assert before["logprobs"] == 7

    await upgrade(pg_url, "0010")  # 0012 drops the foreign keys checked below
    assert await counts(pg_url) == before
    expected = {
        f"exchanges_p{TODAY - timedelta(days=3):%Y%m%d}": 1,
        f"exchanges_p{TODAY - timedelta(days=1):%Y%m%d}": 1,
        f"exchanges_p{TODAY:%Y%m%d}": 1,
        "exchanges_default": 1,
    }
    assert await where_rows_are(pg_url, "exchanges") == expected
    assert await where_rows_are(pg_url, "logprobs") == {
        name.replace("exchanges", "logprobs"): 2 if "default" not in name else 1
        for name in expected
    }
    created = await query(
        pg_url, "SELECT relname FROM pg_class WHERE relkind = 'r' AND relname LIKE 'usage_p%'"
    )
    days = {TODAY + timedelta(days=n) for n in range(-3, partitions.AHEAD_DAYS + 1)}
    assert {name for (name,) in created} == {f"usage_p{day:%Y%m%d}" for day in days}
    # Keys and indexes came along: a record written again is still stored once, a foreign
    # key still refuses an orphan.
    assert await store(pg_url, exchanges) == 0
    assert await store(pg_url, [chat_exchange()]) == 1
    orphan = "INSERT INTO usage (exchange_id, raw) VALUES ('01a21a4d-4000-7000-8000-0', '{}')"
    engine = create_engine(pg_url)
    try:
        async with engine.connect() as conn:
            try:
                await conn.execute(sa.text(orphan))
            except sa.exc.IntegrityError:
                pass
            else:
                raise AssertionError("an orphan usage row was accepted")
    finally:
        await engine.dispose()

    await downgrade(pg_url, BEFORE)
    one_more = {"exchanges": 1, "completions": 1, "choices": 1, "usage": 1}
    assert await counts(pg_url) == {k: v + one_more.get(k, 0) for k, v in before.items()}
    assert await where_rows_are(pg_url, "exchanges") == {"exchanges": 5}


async def reports(url: str) -> list[Any]:
    engine = create_engine(url)
    try:
        found: list[Any] = []
        for by in BYS:
            found.append(await cost_report(engine, by, Filters()))
            found.append(await cost_series(engine, by, "day"))
        return found
    finally:
        await engine.dispose()


async def test_retention_drops_whole_days_and_every_report_stays(pg_url: str) -> None:
    first = TODAY - timedelta(days=6)
    exchanges = workload(120, days=6)
    shift = midnight(first) - datetime(2026, 3, 1, tzinfo=UTC)
    for ex in exchanges:
        minted_at(ex, datetime.fromtimestamp(ex.started_at, UTC) + shift)
    await upgrade(pg_url)
    engine = create_engine(pg_url)
    try:
        async with engine.begin() as conn:  # made ahead by the serve that ran on those days
            past = [first + timedelta(days=n) for n in range(6)]
            assert await conn.run_sync(partitions.create_days, past) == past
    finally:
        await engine.dispose()
    assert await store(pg_url, exchanges) == 120
    before = await reports(pg_url)
    cut = midnight(TODAY - timedelta(days=2))
    due = [ex for ex in exchanges if ex.started_at < cut.timestamp()]
    assert len(due) == 80  # four of the six days

    assert await prune_before(pg_url, cut) == len(due)
    engine = create_engine(pg_url)
    try:
        async with engine.connect() as conn:
            kept = await conn.run_sync(partitions.days)
    finally:
        await engine.dispose()
    assert kept[0] == TODAY - timedelta(days=2)  # the four days' partitions are gone
    assert (await counts(pg_url))["exchanges"] == 40
    assert await reports(pg_url) == before
    assert await prune_before(pg_url, cut) == 0


def batch_fold(conn: sa.Connection, day: date) -> list[tuple[Any, ...]]:
    """The rollups of `day`'s exchanges as the batched deletes fold them (`rollups.add`)."""
    ids = [row.id for row in conn.execute(sa.select(t.exchanges.c.id))]
    ids = [id_ for id_ in ids if partitions.day_of(id_) == day]
    tagged: dict[str, list[tuple[str, str]]] = {id_: [] for id_ in ids}
    for row in conn.execute(sa.select(t.tags).where(t.tags.c.exchange_id.in_(ids))):
        tagged[row.exchange_id].append((row.key, row.value))
    return described(rollups.add(conn.execute(rollups.fold_query(ids)), tagged))


def described(found: list[rollups.Rollup]) -> list[tuple[Any, ...]]:
    return sorted((r.id, r.day, r.group, r.tags, sorted(r.totals.items())) for r in found)


async def test_a_days_fold_sums_as_the_batches_do_whatever_order_its_tags_come_in(
    pg_url: str,
) -> None:
    day = TODAY - timedelta(days=2)
    exchanges = workload(90, days=1)
    shift = midnight(day) - datetime(2026, 3, 1, tzinfo=UTC)
    for n, ex in enumerate(exchanges):
        minted_at(ex, datetime.fromtimestamp(ex.started_at, UTC) + shift)
        if n % 3 == 0:  # one tag set, its rows written in either order: one rollup
            ex.tags = {"team": "red", "app": "web"} if n % 2 else {"app": "web", "team": "red"}
    await upgrade(pg_url)
    engine = create_engine(pg_url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(partitions.create_days, [day])
        assert await store(pg_url, exchanges) == 90
        async with engine.connect() as conn:
            expected = await conn.run_sync(batch_fold, day)
            assert any(len(tags) == 2 for _, _, _, tags, _ in expected)
            assert sum(dict(totals)["requests"] for *_, totals in expected) == 90
            # Walked in key order (the plan the fold asks for) and in the heap's order, where
            # each exchange's tags come as they were written.
            for scans in ((), ("enable_indexscan = off", "enable_bitmapscan = off")):
                for setting in scans:
                    await conn.execute(sa.text(f"SET LOCAL {setting}"))
                assert described(await conn.run_sync(partitions.fold, day)) == expected
                await conn.rollback()
    finally:
        await engine.dispose()


async def test_serve_creates_the_partitions_ahead(pg_url: str, tmp_path: Path) -> None:
    await upgrade(pg_url)
    last = TODAY + timedelta(days=partitions.AHEAD_DAYS)
    for table in reversed(TABLES):  # as if the migration had run a day earlier
        part = partitions.name(table, last)
        await execute(
            pg_url, f'ALTER TABLE "{table}" DETACH PARTITION "{part}"', f'DROP TABLE "{part}"'
        )
    with upstream_process() as upstream:
        serve = Serve(tmp_path, upstream, {"db_url": pg_url})
        await serve.start()
        try:
            await until_async(lambda: has_day(pg_url, last), 20)
        finally:
            serve.release()
    assert "partitions created for " + last.isoformat() in serve.log_text()


async def execute(url: str, *statements: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            for statement in statements:
                await conn.execute(sa.text(statement))
    finally:
        await engine.dispose()


async def has_day(url: str, day: date) -> bool:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return day in await conn.run_sync(partitions.days)
    finally:
        await engine.dispose()


async def until_async(condition: Callable[[], Awaitable[bool]], within: float) -> None:
    deadline = time.monotonic() + within
    while not await condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.2)


async def test_the_configured_retention_cuts_whole_days_on_partitions(
    pg_url: str, tmp_path: Path
) -> None:
    """`retention_days` on a partitioned database cuts at the UTC midnight on or before its
    cut, so a day goes as its dropped partitions, never an hour's exchanges at a time; an
    explicit `--before` stays exact."""
    from tests.cli.test_cli_store import cli

    cut = datetime.now(UTC) - timedelta(days=3)
    floor = midnight(cut.date())
    gone = minted_at(chat_exchange(), floor - timedelta(hours=1))  # the day before the cut's
    kept = minted_at(chat_exchange(), floor + (cut - floor) / 2)  # before the cut, in its day
    await upgrade(pg_url)
    engine = create_engine(pg_url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(partitions.create_days, [floor.date() - timedelta(days=1)])
    finally:
        await engine.dispose()
    assert await store(pg_url, [gone, kept]) == 2
    config = tmp_path / "flightrec.toml"
    config.write_text("retention_days = 3\n")
    run = await cli("prune", "--config", str(config), db_url=pg_url)
    assert run.code == 0, run.err
    assert run.out == f"pruned 1 exchange started before {floor.isoformat()}\n"
    ids = {row[0] for row in await query(pg_url, "SELECT id FROM exchanges")}
    assert ids == {kept.id}
    engine = create_engine(pg_url)
    try:
        async with engine.connect() as conn:
            assert floor.date() - timedelta(days=1) not in await conn.run_sync(partitions.days)
    finally:
        await engine.dispose()
    # To the second when asked for a time.
    run = await cli("prune", "--before", cut.isoformat(), db_url=pg_url)
    assert run.code == 0, run.err
    assert run.out.startswith("pruned 1 exchange started before ")
