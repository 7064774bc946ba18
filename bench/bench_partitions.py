"""Pruning a whole day on a partitioned PostgreSQL database (migration 0010).

    python -m bench.bench_partitions --pg postgresql+asyncpg://user@host/db [--rows N]
        [--batched M]

In a throwaway database at the newest schema it fills one past day's partitions with N
exchanges (default 1,000,000; each with a usage row, half of them a tag, two models, priced),
written by the server itself (`INSERT ... SELECT` over `generate_series`), then:

1. times the fold alone (`partitions.fold`, the rollups of the day, read-only);
2. times `prune` of everything before the next midnight, as `flightrec prune` runs it: the
   day is folded into the rollups and its partitions detached and dropped in one transaction;
3. checks the cost report (per model) is the same before and after;
4. for comparison, fills M exchanges (default 20,000) of a day without partitions (they land
   in DEFAULT) and times the batched deletes `prune` falls back to there.

Goal (issue 36): a day of 1,000,000 exchanges pruned in <= 5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, date, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.store import create_engine, partitions, upgrade
from proxy.store.filters import Filters
from proxy.store.prune import prune, pruning
from proxy.store.report import cost_report

from .bench_record import pg_database

GOAL_S = 5.0
FILL = """
INSERT INTO exchanges (id, started_at, method, path, query, upstream, upstream_url, status,
    stream, model, response_model, outcome, request_omitted, response_omitted, response_bytes,
    chunks, key_hash, key_hint, cost_usd, price_entry, usage_source)
SELECT substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-7' || lpad(to_hex(g % 4096), 3, '0')
        || '-8' || lpad(to_hex(g % 4096), 3, '0') || '-' || lpad(to_hex(g), 12, '0'),
    to_timestamp(ms / 1000.0), 'POST', '/v1/chat/completions', '', 'openai',
    'https://api.openai.com/v1/chat/completions', 200, false,
    (ARRAY['gpt-4o-mini', 'gpt-4o'])[1 + g % 2],
    (ARRAY['gpt-4o-mini-2024-07-18', 'gpt-4o-2024-08-06'])[1 + g % 2], 'ok', false, false,
    900, 0, 'ab12ab12ab12ab12', 'sk-...a1b2', 0.00001 * (1 + g % 7), 'gpt-4o-mini (shipped)',
    'reported'
FROM (SELECT g, CAST(:first_ms AS bigint)
        + ((g - CAST(:origin AS bigint)) * 86399999::bigint / CAST(:total AS bigint)) AS ms
      FROM generate_series(CAST(:start AS bigint), CAST(:start AS bigint) + :count - 1) g) s,
    LATERAL (SELECT lpad(to_hex(ms), 12, '0') AS h) x
"""
CHILDREN = (
    "INSERT INTO usage (exchange_id, prompt_tokens, completion_tokens, total_tokens, raw) "
    "SELECT id, 120, 40, 160, '{}' FROM exchanges WHERE id >= :low AND id < :high",
    "INSERT INTO tags (exchange_id, key, value) SELECT id, 'team', 'red' FROM exchanges "
    "WHERE id >= :low AND id < :high AND right(id, 1) IN ('0', '2', '4', '6', '8', 'a', 'c', 'e')",
)


def midnight(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


CHUNK = 50_000
"""Exchanges a statement: each stays well within the engine's statement timeout."""


def ms_bound(ms: int) -> str:
    """The lowest id of millisecond `ms`."""
    h = f"{ms:012x}"
    return f"{h[:8]}-{h[8:]}-0000-0000-000000000000"


async def fill(engine: AsyncEngine, day: date, rows: int, origin: int) -> float:
    """`rows` exchanges spread over `day`, `CHUNK` a transaction; returns the seconds it
    took."""
    began = time.perf_counter()
    first_ms = int(midnight(day).timestamp() * 1000)

    def ms_of(g: int) -> int:
        return first_ms + (g - origin) * 86399999 // rows

    for start in range(origin, origin + rows, CHUNK):
        count = min(CHUNK, origin + rows - start)
        params = {"first_ms": first_ms, "origin": origin, "total": rows}
        params |= {"start": start, "count": count}
        bounds = {"low": ms_bound(ms_of(start)), "high": ms_bound(ms_of(start + count - 1) + 1)}
        async with engine.begin() as conn:
            await conn.execute(sa.text(FILL), params)
            for statement in CHILDREN:
                await conn.execute(sa.text(statement), bounds)
    async with engine.connect() as conn:
        auto = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await auto.execute(sa.text("VACUUM ANALYZE"))
    return time.perf_counter() - began


async def pruned(engine: AsyncEngine, before: datetime) -> tuple[int, float]:
    began = time.perf_counter()
    async with pruning(engine) as pruner:
        done = await prune(pruner, before, pause=0)
    return done.count, time.perf_counter() - began


async def run(url: str, rows: int, batched: int) -> None:
    await upgrade(url)
    engine = create_engine(url)
    try:
        day = datetime.now(UTC).date() - timedelta(days=3)
        async with engine.begin() as conn:
            await conn.run_sync(partitions.create_days, [day])
        took = await fill(engine, day, rows, 0)
        print(f"filled {rows:,} exchanges of {day} in {took:.1f}s", flush=True)
        report = await cost_report(engine, "model", Filters())
        async with engine.connect() as conn:
            began = time.perf_counter()
            groups = await conn.run_sync(partitions.fold, day)
            folded = time.perf_counter() - began
        print(f"fold alone: {len(groups)} rollups in {folded:.2f}s", flush=True)
        count, took = await pruned(engine, midnight(day + timedelta(days=1)))
        verdict = "ok" if took <= GOAL_S and count == rows else f"GOAL {GOAL_S:.0f} s MISSED"
        print(f"prune (partitions): {count:,} exchanges in {took:.2f}s  {verdict}", flush=True)
        same = await cost_report(engine, "model", Filters()) == report
        print(f"cost report per model unchanged: {same}", flush=True)
        if batched:
            older = day - timedelta(days=1)  # no partition: its rows land in DEFAULT
            await fill(engine, older, batched, rows)
            count, took = await pruned(engine, midnight(older + timedelta(days=1)))
            print(
                f"prune (batched deletes, DEFAULT): {count:,} exchanges in {took:.2f}s "
                f"({took / max(count, 1) * 1e6:.0f} us an exchange)",
                flush=True,
            )
    finally:
        await engine.dispose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", required=True, help="postgresql+asyncpg:// URL of a server")
    parser.add_argument("--rows", type=int, default=1_000_000, help="exchanges in the day")
    parser.add_argument("--batched", type=int, default=20_000, help="exchanges pruned in batches")
    args = parser.parse_args()
    async with pg_database(args.pg) as url:
        await run(url, args.rows, args.batched)


if __name__ == "__main__":
    asyncio.run(main())
