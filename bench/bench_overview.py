"""The overview (`GET /api/overview`) over 90 days of 10,000,000 exchanges: milliseconds.

    python -m bench.bench_overview [--pg postgresql+asyncpg://user@host/db] [--rows N]

The overview reads the writer's running sums (`facets`), so what it costs depends on how many
facet rows the range holds, not on how many exchanges made them. The bench therefore writes
the facet rows that N exchanges (default 10,000,000) spread over 90 days would have left,
straight into the table: every whole hour and day of the range, each split over 3 upstreams,
20 models, 50 keys, 1,000 users (each user in nearly every hour: the worst case for the
table's size), 8 `team` and 2 `env` tags, with tokens, cost and latency histograms. The ragged
half hours at the two ends of the range are real exchanges, written by the writer at the same
rate (what the overview sums from `exchanges` at query time). Then it times
`store.overview.overview` for several filters, 10 times each (p50 and the slowest).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.bench_cost import filled_pg
from proxy.exchange import Exchange
from proxy.store import create_engine, facets, upgrade
from proxy.store import tables as t
from proxy.store.browse import ListFilters
from proxy.store.filters import Filters
from proxy.store.overview import overview
from proxy.store.rows import rows_for
from proxy.store.sqlite_writer import sqlite_time
from proxy.store.writer import writer_for

GOAL_MS = 200.0
DAYS = 90
UNTIL = datetime(2026, 11, 27, 9, 30, tzinfo=UTC)
SINCE = UNTIL - timedelta(days=DAYS)
MODELS = [f"model-{i}" for i in range(20)]
KEYS = [f"{i:02d}" * 32 for i in range(50)]
USERS = [f"user-{i}" for i in range(1000)]
TAGS = [f"team=team-{i}" for i in range(8)] + ["env=prod", "env=dev"]
UPSTREAMS = ["openai", "azure", "local"]


def _split(n: int, ways: int, turn: int) -> list[int]:
    """`n` requests over `ways` values, unevenly (the first values get more), shifted by
    `turn` so each hour looks a little different; sums to `n`."""
    weights = [1.0 / (1 + ((i + turn) % ways) * 0.1) for i in range(ways)]
    scale = n / sum(weights)
    counts = [int(w * scale) for w in weights]
    counts[turn % ways] += n - sum(counts)
    return counts


def _sums(requests: int) -> list[int]:
    out = [0] * len(facets.SUMS)
    out[0], out[1] = requests, requests // 50
    out[2], out[3], out[4], out[5] = requests * 400, requests * 100, requests * 120, requests * 30
    out[6], out[7] = requests * 21_000, requests
    d, tt = facets.SUMS.index("d0"), facets.SUMS.index("t0")
    for at, share in ((7, 2), (8, 4), (9, 3), (10, 1)):
        out[d + at] = requests * share // 10
        out[tt + at - 4] = requests * share // 10
    out[d + 11] += requests - sum(out[d : d + t.HISTOGRAM])
    out[tt + 7] += requests - sum(out[tt : tt + t.HISTOGRAM])
    return out


def _hour_rows(start: datetime, requests: int, turn: int) -> Iterator[dict[str, Any]]:
    dims: list[tuple[str, list[str], float]] = [
        ("all", [""], 1.0),
        ("upstream", UPSTREAMS, 1.0),
        ("model", MODELS, 1.0),
        ("model_any", MODELS, 1.0),
        ("key", KEYS, 1.0),
        ("user", USERS, 1.0),
        ("tag", TAGS[:8], 0.6),
        ("tag", TAGS[8:], 0.5),
    ]
    for dim, values, share in dims:
        for value, count in zip(
            values, _split(int(requests * share), len(values), turn), strict=True
        ):
            if count:
                hint = f"sk-...{value[-4:]}" if dim == "key" else None
                yield {"dim": dim, "value": value, "span": "hour", "start": start, "hint": hint,
                       **dict(zip(facets.SUMS, _sums(count), strict=True))}  # fmt: skip


def synthesize(rows: int) -> Iterator[list[dict[str, Any]]]:
    """Facet rows, a day at a time (its hours, then the day), for the whole hours of the range."""
    first, last = (
        facets.span_start(SINCE, "hour") + timedelta(hours=1),
        facets.span_start(UNTIL, "hour"),
    )
    per_hour = rows / ((UNTIL - SINCE) / timedelta(hours=1))
    at = first
    while at < last:
        day_end = min(facets.span_start(at, "day") + timedelta(days=1), last)
        hours: list[dict[str, Any]] = []
        while at < day_end:
            turn = int(at.timestamp() // 3600)
            diurnal = 1 + 0.5 * ((turn % 24) - 12) / 12
            hours += _hour_rows(at, int(per_hour * diurnal), turn)
            at += timedelta(hours=1)
        days: dict[tuple[str, str], dict[str, Any]] = {}
        for row in hours:
            day = days.setdefault((row["dim"], row["value"]), {**row, "span": "day",
                                  "start": facets.span_start(row["start"], "day"),
                                  **dict.fromkeys(facets.SUMS, 0)})  # fmt: skip
            for name in facets.SUMS:
                day[name] += row[name]
        yield hours + list(days.values())


def edge_exchanges(rows: int) -> list[Exchange]:
    """Real exchanges, at the same rate, in the half hours at the range's two ends."""
    per_second = rows / (UNTIL - SINCE).total_seconds()
    found = []
    for lo, hi in ((SINCE, facets.span_start(SINCE, "hour") + timedelta(hours=1)),
                   (facets.span_start(UNTIL, "hour"), UNTIL)):  # fmt: skip
        count = int((hi - lo).total_seconds() * per_second)
        for i in range(count):
            ex = Exchange.start("POST", "/v1/chat/completions", "", UPSTREAMS[i % 3])
            ex.started_at = lo.timestamp() + i / per_second
            ex.model, ex.status, ex.duration_ms, ex.ttft_ms = MODELS[i % 20], 200, 800.0, 300.0
            ex.key_hash, ex.key_hint, ex.user = KEYS[i % 50], "sk-...x", USERS[i % 1000]
            ex.usage = {"prompt_tokens": 400, "completion_tokens": 120}
            ex.usage_source = "reported"
            found.append(ex)
    return found


async def fill(url: str, rows: int) -> None:
    engine = create_engine(url)
    names = facets.columns()
    try:
        async with engine.begin() as conn:
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            assert driver is not None
            for day in synthesize(rows):
                records = [tuple(r[n] for n in names) for r in day]
                if engine.dialect.name == "postgresql":
                    await driver.copy_records_to_table(
                        "facets", records=records, columns=list(names)
                    )
                else:
                    records = [(*r[:2], sqlite_time(r[2]), *r[3:]) for r in records]
                    await driver.executemany(facets.upsert_sql("sqlite"), records)
        if engine.dialect.name == "postgresql":
            # What autovacuum does to a table written to all day: the top lists' index-only
            # scans need its visibility map.
            async with engine.connect() as conn:
                autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
                await autocommit.exec_driver_sql("VACUUM ANALYZE facets")
        writer = writer_for(engine)
        exchanges = edge_exchanges(rows)
        for start in range(0, len(exchanges), 500):
            await writer.write([rows_for(ex) for ex in exchanges[start : start + 500]])
        await writer.close()
    finally:
        await engine.dispose()


CASES: dict[str, ListFilters] = {
    "90 days": ListFilters(Filters(SINCE, UNTIL)),
    "90 days, model=": ListFilters(Filters(SINCE, UNTIL, model="model-3")),
    "90 days, key=": ListFilters(Filters(SINCE, UNTIL, key=KEYS[7][:12])),
    "90 days, tag=": ListFilters(Filters(SINCE, UNTIL, tags=(("team", "team-2"),))),
    "24 hours": ListFilters(Filters(UNTIL - timedelta(hours=24), UNTIL)),
}


async def time_cases(name: str, url: str) -> dict[str, tuple[float, float]]:
    engine = create_engine(url)
    out = {}
    try:
        async with engine.connect() as conn:
            count = (await conn.exec_driver_sql("SELECT count(*) FROM facets")).scalar()
        print(f"{name}: {count:,} facet rows")
        for case, filters in CASES.items():
            times = []
            for _ in range(10):
                begin = time.perf_counter()
                found = await overview(engine, filters)
                times.append((time.perf_counter() - begin) * 1000)
            out[case] = (statistics.median(times), max(times))
            print(f"{name:<10} {case:<18} p50 {out[case][0]:7.1f} ms  max {out[case][1]:7.1f} ms"
                  f"  ({found['totals']['requests']:,} requests)")  # fmt: skip
    finally:
        await engine.dispose()
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pg", help="a PostgreSQL URL; a scratch database is made beside it")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if args.no_sqlite:
            folder = ""
        if folder:
            url = f"sqlite+aiosqlite:///{folder}/overview.db"
            await upgrade(url)
            begin = time.perf_counter()
            await fill(url, args.rows)
            print(f"sqlite filled in {time.perf_counter() - begin:.0f} s")
            await time_cases("sqlite", url)
    if args.pg:
        async with filled_pg(args.pg, args.rows, fill) as target:
            await time_cases("postgresql", target)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
