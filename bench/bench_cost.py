"""The spend report on a big database: seconds per `flightrec cost --by ...`.

    python -m bench.bench_cost [--pg postgresql+asyncpg://user@host/db] [--rows N] [--reprice]

For each engine (a SQLite file in a temporary directory; PostgreSQL when `--pg` is given, in a
throwaway database created next to the one named and dropped afterwards) it generates N
exchanges (default 1,000,000) straight into the database, as the writer would have stored
them: 90 days of traffic over 20 models (one unknown to the price table), 50 keys, 1,000 users,
3 upstreams; 95 % with usage, 2 % with usage missing; a `team` tag on 60 % and an `env` tag on
half. Then it times `proxy.store.report.cost_report` (what `flightrec cost` runs) for every
grouping, and two filtered reports, three times each (median), and checks that every grouping
adds up to the same total. `--reprice` also times a full `cost --reprice`. Goal: every report
under 3 s on 1M exchanges.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import orjson
from sqlalchemy.engine import make_url

from proxy.pricing import Prices
from proxy.store import create_engine, upgrade
from proxy.store.filters import Filters
from proxy.store.read import parse_since
from proxy.store.report import cost_report, total
from proxy.store.reprice import reprice
from proxy.usage import decode_usage

GOAL_S = 3.0
CHUNK = 50_000
MODELS = [
    *(f"{m}-2024-07-18" for m in ("gpt-4o-mini", "gpt-4o", "gpt-4.1", "gpt-4.1-mini")),
    *("gpt-5", "gpt-5-mini", "gpt-5-nano", "o3", "o4-mini", "gpt-4.1-nano", "o3-mini"),
    *("gpt-3.5-turbo", "gpt-4-turbo", "text-embedding-3-small", "text-embedding-3-large"),
    *("gpt-4o-mini-2024-07-18", "gpt-4o-2024-08-06", "gpt-5-2025-08-07", "o1"),
    "acme-7b",  # unknown to the table: unpriced
]
TEAMS = [f"team-{i}" for i in range(8)]
UPSTREAMS = ["openai", "azure", "local"]
START = datetime(2025, 1, 1, tzinfo=UTC)
EXCHANGE_COLUMNS = (
    "id", "started_at", "method", "path", "query", "upstream", "upstream_url", "status",
    "stream", "model", "response_model", "outcome", "request_omitted", "response_omitted",
    "response_bytes", "chunks", "key_hash", "key_hint", "end_user", "usage_source", "cost_usd",
    "price_entry",
)  # fmt: skip
USAGE_COLUMNS = (
    "exchange_id", "prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens",
    "reasoning_tokens", "raw",
)  # fmt: skip


def usages(rng: random.Random, count: int = 1000) -> list[dict[str, Any]]:
    pool = []
    for _ in range(count):
        prompt, completion = rng.randint(10, 20_000), rng.randint(0, 4_000)
        pool.append(
            {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": rng.choice([0, 0, prompt // 2])},
                "completion_tokens_details": {"reasoning_tokens": rng.randint(0, completion)},
            }
        )
    return pool


PRICES = Prices()


@cache
def priced(model_index: int, usage_index: int) -> tuple[float | None, str | None]:
    found = PRICES.price(decode_usage(USAGES[usage_index]), MODELS[model_index])
    return (None, None) if found is None else (found.cost_usd, found.source)


USAGES = usages(random.Random(1))
RAW = [orjson.dumps(u).decode() for u in USAGES]


def exchange_id(ms: int, seq: int, rng: random.Random) -> str:
    value = ms << 80 | 0x7 << 76 | (seq & 0xFFF) << 64 | 0b10 << 62 | rng.getrandbits(62)
    return str(uuid.UUID(int=value))


def generate(rows: int, seed: int = 7) -> Iterator[tuple[list[tuple[Any, ...]], ...]]:
    """Chunks of (exchanges, usage, tags) rows; started_at as aware datetimes."""
    rng = random.Random(seed)
    span_ms = 90 * 86_400_000
    step = span_ms // rows
    keys = [(f"{i:016x}", f"sk-...{i:04d}") for i in range(50)]
    exchanges: list[tuple[Any, ...]] = []
    usage: list[tuple[Any, ...]] = []
    tags: list[tuple[Any, ...]] = []
    for n in range(rows):
        ms = int(START.timestamp() * 1000) + n * step + rng.randrange(max(step, 1))
        id_ = exchange_id(ms, n, rng)
        m = rng.randrange(len(MODELS))
        u = rng.randrange(len(USAGES))
        roll = rng.random()
        has_usage, source = roll < 0.95, "reported" if roll < 0.95 else None
        if 0.95 <= roll < 0.97:
            source = "missing"
        cost, entry = priced(m, u) if has_usage else (None, None)
        key_hash, key_hint = keys[rng.randrange(len(keys))]
        path = "/v1/embeddings" if "embedding" in MODELS[m] else "/v1/chat/completions"
        status = 200 if roll < 0.99 else 429
        exchanges.append(
            (
                id_, datetime.fromtimestamp(ms / 1000, UTC), "POST", path, "",
                UPSTREAMS[rng.randrange(3)], "https://api.openai.com" + path, status,
                rng.random() < 0.5, MODELS[m].removesuffix("-2024-07-18"), MODELS[m],
                "ok" if status == 200 else "upstream_error", False, False, 1234, 0,
                key_hash, key_hint, f"user-{rng.randrange(1000)}", source, cost, entry,
            )
        )  # fmt: skip
        if has_usage:
            found = USAGES[u]
            usage.append(
                (
                    id_, found["prompt_tokens"], found["completion_tokens"],
                    found["total_tokens"], found["prompt_tokens_details"]["cached_tokens"],
                    found["completion_tokens_details"]["reasoning_tokens"], RAW[u],
                )
            )  # fmt: skip
        if rng.random() < 0.6:
            tags.append((id_, "team", TEAMS[rng.randrange(len(TEAMS))]))
        if rng.random() < 0.5:
            tags.append((id_, "env", rng.choice(["prod", "staging"])))
        if len(exchanges) >= CHUNK:
            yield exchanges, usage, tags
            exchanges, usage, tags = [], [], []
    if exchanges:
        yield exchanges, usage, tags


def _sqlite_time(row: tuple[Any, ...]) -> tuple[Any, ...]:
    # As SQLAlchemy stores a DateTime on SQLite: UTC wall time as text.
    return (row[0], row[1].strftime("%Y-%m-%d %H:%M:%S.%f"), *row[2:])


def fill_sqlite(path: str, rows: int) -> None:
    db = sqlite3.connect(path)
    db.execute("PRAGMA synchronous = OFF")
    insert_ex = (
        f"INSERT INTO exchanges ({', '.join(EXCHANGE_COLUMNS)}) "
        f"VALUES ({', '.join('?' * len(EXCHANGE_COLUMNS))})"
    )
    insert_usage = (
        f"INSERT INTO usage ({', '.join(USAGE_COLUMNS)}) "
        f"VALUES ({', '.join('?' * len(USAGE_COLUMNS))})"
    )
    with db:
        for exchanges, usage, tags in generate(rows):
            db.executemany(insert_ex, map(_sqlite_time, exchanges))
            db.executemany(insert_usage, usage)
            db.executemany("INSERT INTO tags (exchange_id, key, value) VALUES (?, ?, ?)", tags)
    db.execute("ANALYZE")
    db.close()


async def fill_pg(url: str, rows: int) -> None:
    conn = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(False))
    try:
        for exchanges, usage, tags in generate(rows):
            await conn.copy_records_to_table(
                "exchanges", records=exchanges, columns=EXCHANGE_COLUMNS
            )
            await conn.copy_records_to_table("usage", records=usage, columns=USAGE_COLUMNS)
            await conn.copy_records_to_table(
                "tags", records=tags, columns=("exchange_id", "key", "value")
            )
        await conn.execute("VACUUM ANALYZE")  # what autovacuum does soon after a bulk load
    finally:
        await conn.close()


async def time_reports(name: str, url: str, rows: int, with_reprice: bool) -> list[float]:
    engine = create_engine(url)
    now = START + timedelta(days=90)
    cases: list[tuple[str, str, Filters]] = [
        (f"--by {by}", by, Filters())
        for by in ("model", "key", "user", "tag:team", "day", "upstream")
    ]
    cases.append(("--by model --since 7d", "model", Filters(since=parse_since("7d", now))))
    cases.append(("--by day --tag team=team-3", "day", Filters(tags=(("team", "team-3"),))))
    totals = set()
    seconds = []
    try:
        for label, by, filters in cases:
            runs = []
            for _ in range(3):
                begin = time.perf_counter()
                found = await cost_report(engine, by, filters)
                runs.append(time.perf_counter() - begin)
            median = statistics.median(runs)
            seconds.append(median)
            summed = total(found)
            if not filters.tags and filters.since is None:
                totals.add((summed["requests"], summed["cost_usd"], summed["unpriced_requests"]))
            verdict = "ok" if median < GOAL_S else f"ABOVE GOAL {GOAL_S}s"
            print(
                f"{name:<10} {rows:>9,} exchanges  cost {label:<28} {median:6.2f} s "
                f"({len(found):>4} groups)  {verdict}",
                flush=True,
            )
        assert len(totals) == 1, f"groupings disagree on the total: {totals}"
        requests, cost, unpriced = totals.pop()
        print(f"{name:<10} every grouping: {requests:,} requests, ${cost}, {unpriced:,} unpriced")
        if with_reprice:
            begin = time.perf_counter()
            done = await reprice(engine, PRICES)
            took = time.perf_counter() - begin
            print(f"{name:<10} cost --reprice: {done.total().seen:,} exchanges in {took:.1f} s")
    finally:
        await engine.dispose()
    return seconds


async def filled_sqlite(tmp: str, rows: int, fill: Callable[[str, int], None]) -> str:
    """The URL of a SQLite database in `tmp`, migrated and filled with `rows` exchanges by
    `fill` (given the file's path, run on a worker thread)."""
    path = f"{tmp}/bench.db"
    url = f"sqlite+aiosqlite:///{path}"
    await upgrade(url)
    begin = time.perf_counter()
    await asyncio.to_thread(fill, path, rows)
    print(f"sqlite     generated {rows:,} exchanges in {time.perf_counter() - begin:.0f} s")
    return url


async def run_sqlite(tmp: str, rows: int, with_reprice: bool) -> None:
    url = await filled_sqlite(tmp, rows, fill_sqlite)
    await time_reports("sqlite", url, rows, with_reprice)


@contextlib.asynccontextmanager
async def filled_pg(
    base: str, rows: int, fill: Callable[[str, int], Awaitable[None]]
) -> AsyncIterator[str]:
    """A scratch database on the server of `base`, migrated and filled with `rows` exchanges
    by `fill`; its URL while the block runs, dropped after."""
    url = make_url(base)
    admin = await asyncpg.connect(url.set(drivername="postgresql").render_as_string(False))
    name = f"flightrec_bench_{uuid.uuid4().hex[:10]}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        target = url.set(database=name).render_as_string(False)
        await upgrade(target)
        begin = time.perf_counter()
        await fill(target, rows)
        print(f"postgresql generated {rows:,} exchanges in {time.perf_counter() - begin:.0f} s")
        yield target
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def run_pg(base: str, rows: int, with_reprice: bool) -> None:
    async with filled_pg(base, rows, fill_pg) as target:
        await time_reports("postgresql", target, rows, with_reprice)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", help="postgresql+asyncpg:// URL of a server to bench on")
    parser.add_argument("--rows", type=int, default=1_000_000, help="exchanges to generate")
    parser.add_argument("--reprice", action="store_true", help="also time a full --reprice")
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_sqlite:
            await run_sqlite(tmp, args.rows, args.reprice)
        if args.pg:
            await run_pg(args.pg, args.rows, args.reprice)


if __name__ == "__main__":
    asyncio.run(main())
