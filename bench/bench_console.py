"""The console's API on a big database: p95 milliseconds per request, over HTTP.

    python -m bench.bench_console [--pg postgresql+asyncpg://user@host/db] [--rows N]

For each engine (a SQLite file in a temporary directory; PostgreSQL when `--pg` is given, in a
throwaway database dropped afterwards) it generates N exchanges (default 1,000,000) with
`bench_cost`'s generator (90 days, 20 models, 50 keys, 1,000 users, 3 upstreams, tags), and
gives each a request body (a short prompt), an answer (a `choices` row) and a
`system_fingerprint`, so text search and the fingerprint filter have something to read. Then it
serves the console app on a local port and times, through a real HTTP client: the list API's
first page and a page deep in the list (a cursor half-way back), the first page with each
single filter, the text search, the exchange API, and the cost series over the 90 days.
Goals (issue 19): list <= 100 ms p95, exchange <= 50 ms, series <= 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import aiohttp
import asyncpg  # type: ignore[import-untyped]
import orjson
from aiohttp import web
from sqlalchemy.engine import make_url

from proxy.config import Config
from proxy.console import build_console
from proxy.store.browse import encode_cursor

from . import bench_cost as gen

WORDS = [
    "apple",
    "river",
    "cloud",
    "stone",
    "quick",
    "bright",
    "silent",
    "paper",
    "window",
    "garden",
    "ocean",
    "number",
]
FINGERPRINTS = [f"fp_{i:010x}" for i in range(12)]
EXTRA = ("request", "system_fingerprint")
CHOICE_COLUMNS = ("exchange_id", "choice_index", "role", "content", "finish_reason")


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def generate(rows: int) -> Iterator[tuple[list[tuple[Any, ...]], ...]]:
    """`bench_cost.generate`'s chunks, each exchange with a request, an answer and a
    fingerprint; one exchange in 50,000 asks about a 'zebra' (a rare word to search)."""
    rng = random.Random(11)
    count = 0
    for exchanges, usage, tags in gen.generate(rows):
        more, choices = [], []
        for row in exchanges:
            count += 1
            prompt = _text(rng, 12) + (" zebra" if count % 50_000 == 0 else "")
            body = orjson.dumps(
                {"model": row[9], "messages": [{"role": "user", "content": prompt}]}
            )
            more.append((*row, body.decode(), rng.choice(FINGERPRINTS)))
            choices.append((row[0], 0, "assistant", _text(rng, 30), "stop"))
        yield more, usage, tags, choices


def fill_sqlite(path: str, rows: int) -> None:
    db = sqlite3.connect(path)
    db.execute("PRAGMA synchronous = OFF")

    def insert(table: str, columns: tuple[str, ...]) -> str:
        marks = ", ".join("?" * len(columns))
        return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"

    with db:
        for exchanges, usage, tags, choices in generate(rows):
            rows_in = map(gen._sqlite_time, exchanges)
            db.executemany(insert("exchanges", gen.EXCHANGE_COLUMNS + EXTRA), rows_in)
            db.executemany(insert("usage", gen.USAGE_COLUMNS), usage)
            db.executemany(insert("tags", ("exchange_id", "key", "value")), tags)
            db.executemany(insert("choices", CHOICE_COLUMNS), choices)
    db.execute("ANALYZE")
    db.close()


async def fill_pg(url: str, rows: int) -> None:
    conn = await asyncpg.connect(make_url(url).set(drivername="postgresql").render_as_string(False))
    try:
        for exchanges, usage, tags, choices in generate(rows):
            await conn.copy_records_to_table(
                "exchanges", records=exchanges, columns=gen.EXCHANGE_COLUMNS + EXTRA
            )
            await conn.copy_records_to_table("usage", records=usage, columns=gen.USAGE_COLUMNS)
            await conn.copy_records_to_table(
                "tags", records=tags, columns=("exchange_id", "key", "value")
            )
            await conn.copy_records_to_table("choices", records=choices, columns=CHOICE_COLUMNS)
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


def cases(rows: int) -> list[tuple[str, str]]:
    """(label, path and query) of every list request timed."""
    middle = gen.START + timedelta(days=45)
    deep = encode_cursor(middle.isoformat(), "ffffffff-ffff-7fff-bfff-ffffffffffff")
    now = gen.START + timedelta(days=90)
    week = (now - timedelta(days=7)).isoformat()
    filters = {
        "model": "gpt-4o-2024-08-06",
        "outcome": "upstream_error",
        "status": "429",
        "user": "user-7",
        "key": "sk-...0007",
        "tag": "team=team-3",
        "upstream": "azure",
        "fingerprint": FINGERPRINTS[3],
        "replay_of": "01000000-0000-7000-8000-000000000000",
        "since": week,
        "until": middle.isoformat(),
    }
    found = [
        ("first page", "/api/exchanges"),
        ("deep page (day 45)", f"/api/exchanges?cursor={deep}"),
    ]
    found += [(f"{k}=", f"/api/exchanges?{k}={quote(v)}") for k, v in filters.items()]
    found += [
        (f"{k}= deep", f"/api/exchanges?{k}={quote(v)}&cursor={deep}") for k, v in filters.items()
    ]
    nothing = {  # values no exchange has: the filter alone must find there are none
        "outcome": "timeout",
        "status": "500",
        "model": "no-such-model",
        "user": "no-such-user",
        "key": "sk-...none",
        "tag": "team=none",
        "upstream": "none",
        "fingerprint": "fp_none",
    }
    found += [(f"{k}= (no match)", f"/api/exchanges?{k}={quote(v)}") for k, v in nothing.items()]
    found += [
        ("q=common words", "/api/exchanges?q=river%20cloud"),
        ("q=rare word", "/api/exchanges?q=zebra"),
    ]
    return found


async def p95(session: aiohttp.ClientSession, url: str, runs: int) -> tuple[float, Any]:
    """p95 (or the max of fewer than 20 runs) in ms, and the last answer."""
    times, body = [], None
    for _ in range(runs):
        begin = time.perf_counter()
        async with session.get(url) as response:
            body = await response.json()
            assert response.status == 200, body
        times.append((time.perf_counter() - begin) * 1000)
    times.sort()
    return times[max(0, int(len(times) * 0.95) - 1)] if runs >= 20 else times[-1], body


async def time_api(name: str, db_url: str, rows: int, runs: int) -> list[tuple[str, float]]:
    app = build_console(replace(Config(), db_url=db_url))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    root = f"http://127.0.0.1:{runner.addresses[0][1]}"
    results = []
    try:
        async with aiohttp.ClientSession() as session:
            for label, path in cases(rows):
                ms, body = await p95(session, root + path, runs)
                results.append((f"list {label}", ms))
                print(f"{name:<10} {rows:>9,}  list {label:<24} p95 {ms:8.1f} ms  "
                      f"({len(body['items'])} items)", flush=True)  # fmt: skip
            _, page = await p95(session, root + "/api/exchanges?limit=500", 1)
            ids = [item["id"] for item in page["items"]]
            rng = random.Random(3)
            times = []
            for _ in range(runs):
                ms, _ = await p95(session, f"{root}/api/exchanges/{rng.choice(ids)}", 1)
                times.append(ms)
            ms = sorted(times)[max(0, int(len(times) * 0.95) - 1)]
            results.append(("exchange", ms))
            print(f"{name:<10} {rows:>9,}  exchange API               p95 {ms:8.1f} ms", flush=True)
            for by in ("model", "tag:team"):
                for bucket in ("day", "hour"):
                    url = f"{root}/api/cost/series?by={by}&bucket={bucket}"
                    ms, _ = await p95(session, url, 3)  # the slowest of 3
                    results.append((f"series by {by} per {bucket}", ms))
                    print(f"{name:<10} {rows:>9,}  series 90 days by {by} per {bucket:<5}"
                          f" max {ms:8.1f} ms", flush=True)  # fmt: skip
    finally:
        await runner.cleanup()
    return results


async def run_sqlite(tmp: str, rows: int, runs: int) -> list[tuple[str, float]]:
    url = await gen.filled_sqlite(tmp, rows, fill_sqlite)
    return await time_api("sqlite", url, rows, runs)


async def run_pg(base: str, rows: int, runs: int) -> list[tuple[str, float]]:
    async with gen.filled_pg(base, rows, fill_pg) as target:
        return await time_api("postgresql", target, rows, runs)


def table(rows: int, found: dict[str, list[tuple[str, float]]]) -> str:
    engines = list(found)
    lines = [
        f"| {rows:,} exchanges | " + " | ".join(f"{e} (ms)" for e in engines) + " |",
        "| --- |" + " ---: |" * len(engines),
    ]
    labels = [label for label, _ in next(iter(found.values()))]
    for i, label in enumerate(labels):
        cells = " | ".join(f"{found[e][i][1]:.1f}" for e in engines)
        lines.append(f"| {label} | {cells} |")
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", help="postgresql+asyncpg:// URL of a server to bench on")
    parser.add_argument("--rows", type=int, default=1_000_000, help="exchanges to generate")
    parser.add_argument("--runs", type=int, default=20, help="requests per list case")
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    args = parser.parse_args()
    found: dict[str, list[tuple[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_sqlite:
            found["sqlite"] = await run_sqlite(tmp, args.rows, args.runs)
        if args.pg:
            found["postgresql"] = await run_pg(args.pg, args.rows, args.runs)
    if found:
        print(table(args.rows, found))


if __name__ == "__main__":
    asyncio.run(main())
