"""The overview (`GET /api/overview`) over 90 days of 10,000,000 exchanges: milliseconds.

    python -m bench.bench_overview [--pg postgresql+asyncpg://user@host/db] [--rows N]
        [--sqlite FILE] [--pg-keep URL] [--base CHECKOUT] [--rounds N] [--runs N]

The overview reads the writer's running sums (`facets`), so what it costs depends on how many
facet rows the range holds, not on how many exchanges made them. The bench therefore writes
the facet rows that N exchanges (default 10,000,000) spread over 90 days would have left,
straight into the table: every whole hour and day of the range, each split over 3 upstreams,
20 models, 50 keys, 1,000 users (each user in nearly every hour: the worst case for the
table's size), 8 `team` and 2 `env` tags, with tokens, cost and latency histograms. The ragged
half hours at the two ends of the range are real exchanges, written by the writer at the same
rate (what the overview sums from `exchanges` at query time). `--sqlite FILE` and `--pg-keep
URL` keep the filled database for the next run (filled only when new).

It then drops the overview's folded rows (`store.folds`) and times the first 90-day call,
which folds the range's runs again, and times `store.overview.overview` for several filters,
`--runs` calls per case in each of `--rounds` rounds (p50 and the slowest). With `--base
CHECKOUT` (main) each round first times that checkout's overview on the same database, in a
process of its own, and the ratio of the medians is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from bench import procs
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
    names = facets.COLUMNS
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


async def time_cases(url: str, runs: int) -> dict[str, list[float]]:
    """Milliseconds of each case's `runs` calls, after one call not timed (the connections)."""
    engine = create_engine(url)
    out: dict[str, list[float]] = {}
    try:
        for case, filters in CASES.items():
            await overview(engine, filters)
            times = out[case] = []
            for _ in range(runs):
                begin = time.perf_counter()
                await overview(engine, filters)
                times.append((time.perf_counter() - begin) * 1000)
    finally:
        await engine.dispose()
    return out


async def base_times(folder: str, url: str, runs: int) -> dict[str, list[float]]:
    """`time_cases` with the code of the checkout `folder`, in a process of its own."""
    env = {**os.environ, "PYTHONPATH": procs.pythonpath(folder, os.getcwd())}
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--time-only", url, "--runs", str(runs),
        env=env, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    output, _ = await child.communicate()
    assert child.returncode == 0, "the base checkout's run failed"
    found: dict[str, list[float]] = json.loads(output.decode().splitlines()[-1])
    return found


async def measure(name: str, url: str, base: str | None, rounds: int, runs: int) -> None:
    """Each round times every case with the base checkout (if any), then with this one; the
    first call, which folds the range's runs (`store.folds`), is timed apart."""
    from proxy.store import folds  # not in a base checkout that runs `time_cases` alone

    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.delete(t.facets).where(t.facets.c.span.in_(folds.LEVELS)))
            count = (await conn.exec_driver_sql("SELECT count(*) FROM facets")).scalar()
        begin = time.perf_counter()
        found = await overview(engine, CASES["90 days"])
        first = (time.perf_counter() - begin) * 1000
        async with engine.connect() as conn:
            query = sa.select(sa.func.count()).where(t.facets.c.span.in_(folds.LEVELS))
            folded = (await conn.execute(query)).scalar()
        if engine.dialect.name == "postgresql":
            # As after the fill: the folded rows dropped and written again leave dead index
            # entries that autovacuum clears in a running database.
            async with engine.connect() as conn:
                autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
                await autocommit.exec_driver_sql("VACUUM ANALYZE facets")
    finally:
        await engine.dispose()
    print(f"{name}: {count:,} facet rows, {found['totals']['requests']:,} requests in 90 days;"
          f" the first call {first:.0f} ms, folding {folded:,} rows")  # fmt: skip
    sides = {"base": base, "this": "."} if base else {"this": "."}
    times: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
    for _ in range(rounds):
        for side, folder in sides.items():
            got = await (base_times(folder, url, runs) if side == "base" else time_cases(url, runs))
            for case, values in got.items():
                times[side].setdefault(case, []).extend(values)
    for case in CASES:
        line = f"{name:<10} {case:<18}"
        for side in sides:
            values = times[side][case]
            line += f"  {side} p50 {statistics.median(values):7.1f} ms (max {max(values):7.1f})"
        if base:
            ratio = statistics.median(times["this"][case]) / statistics.median(times["base"][case])
            line += f"  this/base {ratio:.2f}"
        print(line)


async def sqlite_db(path: str, rows: int) -> str:
    """The SQLite database at `path`, filled unless it holds facet rows already."""
    url = f"sqlite+aiosqlite:///{path}"
    if not await asyncio.to_thread(os.path.exists, path):
        await upgrade(url)
        begin = time.perf_counter()
        await fill(url, rows)
        print(f"sqlite filled in {time.perf_counter() - begin:.0f} s")
    return url


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pg", help="a PostgreSQL URL; a scratch database is made beside it")
    parser.add_argument("--pg-keep", help="instead, this PostgreSQL URL's database, filled once")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    parser.add_argument("--sqlite", help="keep the SQLite database in this file, filled once")
    parser.add_argument("--base", help="a checkout (main) to time on the same databases")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each side (A/B)")
    parser.add_argument("--runs", type=int, default=5, help="calls per case and round")
    parser.add_argument("--time-only", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.time_only:
        print(json.dumps(await time_cases(args.time_only, args.runs)))
        return
    with tempfile.TemporaryDirectory() as folder:
        if not args.no_sqlite:
            url = await sqlite_db(args.sqlite or f"{folder}/overview.db", args.rows)
            await measure("sqlite", url, args.base, args.rounds, args.runs)
    if args.pg_keep:
        engine = create_engine(args.pg_keep)
        try:
            async with engine.connect() as conn:
                filled = (await conn.exec_driver_sql("SELECT 1 FROM facets LIMIT 1")).first()
        except Exception:
            await upgrade(args.pg_keep)
            filled = None
        finally:
            await engine.dispose()
        if filled is None:
            await fill(args.pg_keep, args.rows)
        await measure("postgresql", args.pg_keep, args.base, args.rounds, args.runs)
    elif args.pg:
        async with filled_pg(args.pg, args.rows, fill) as target:
            await measure("postgresql", target, args.base, args.rounds, args.runs)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
