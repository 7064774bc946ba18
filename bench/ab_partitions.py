"""The fold and the prune of whole days, this tree against another (main), in one run.

    python -m bench.ab_partitions --pg postgresql+asyncpg://user@host/db --base /work/main \
        [--fill N --days D] [--rounds R] [--prune]

On a database at the newest schema whose past days' partitions hold `bench_partitions`'
exchanges (`--fill N --days D` first fills D days before today of N exchanges each, in the
database named; without it the days already there are used):

1. times the fold of the newest filled day (`partitions.fold`, read-only) by the base tree's
   `proxy/store/partitions.py` and this tree's, alternating, `--rounds` times each, and
   checks both give the same rollups;
2. with `--prune`, prunes the filled days oldest first, the base's module and this one's
   taking turns (`prune` as `flightrec prune` runs it, whole days), checking the cost report
   per model is the same after each.

Load `uptime` beside each figure: the two sides run on the same machine at the same time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, date, datetime, timedelta
from types import ModuleType

import sqlalchemy as sa

import proxy.store.prune as pruning_module
from proxy.store import create_engine, partitions, upgrade
from proxy.store.filters import Filters
from proxy.store.prune import prune, pruning
from proxy.store.report import cost_report

from .bench_partitions import fill, midnight
from .procs import checkout_module


def base_module(tree: str) -> ModuleType:
    """The base tree's `partitions` module, beside this tree's (sharing the rest)."""
    return checkout_module(tree, "proxy/store/partitions.py", "base_partitions")


def filled_days(conn: sa.Connection) -> list[date]:
    today = datetime.now(UTC).date()
    return [day for day in partitions.days(conn) if day < today]


async def run(url: str, tree: str, rows: int, days: int, rounds: int, prune_too: bool) -> None:
    sides = {"base": base_module(tree), "this": partitions}
    await upgrade(url)
    engine = create_engine(url)
    try:
        if rows:
            today = datetime.now(UTC).date()
            wanted = [today - timedelta(days=n) for n in range(days + 2, 2, -1)]
            async with engine.begin() as conn:
                await conn.run_sync(partitions.create_days, wanted)
            for n, day in enumerate(wanted):
                took = await fill(engine, day, rows, n * rows)
                print(f"filled {rows:,} exchanges of {day} in {took:.1f}s", flush=True)
        async with engine.connect() as conn:
            found = await conn.run_sync(filled_days)
        times: dict[str, list[float]] = {name: [] for name in sides}
        folded = {}
        for _ in range(rounds):
            for name, module in sides.items():
                async with engine.connect() as conn:
                    began = time.perf_counter()
                    groups = await conn.run_sync(module.fold, found[-1])
                    times[name].append(time.perf_counter() - began)
                    await conn.rollback()
                folded[name] = sorted((g.id, sorted(g.totals.items())) for g in groups)
        for name, each in times.items():
            runs = " ".join(f"{x:.2f}" for x in each)
            print(f"fold of {found[-1]}, {name}: median {statistics.median(each):.2f}s ({runs})")
        print(f"the same rollups: {folded['base'] == folded['this']}", flush=True)
        if not prune_too:
            return
        report = await cost_report(engine, "model", Filters())
        for n, day in enumerate(found):
            name = ("base", "this")[n % 2]
            setattr(pruning_module, "partitions", sides[name])  # noqa: B010 (not exported)
            began = time.perf_counter()
            async with pruning(engine) as pruner:
                done = await prune(pruner, midnight(day + timedelta(days=1)), pause=0)
            took = time.perf_counter() - began
            same = await cost_report(engine, "model", Filters()) == report
            print(
                f"prune of {day}, {name}: {done.count:,} exchanges in {took:.2f}s; "
                f"cost report per model unchanged: {same}",
                flush=True,
            )
    finally:
        setattr(pruning_module, "partitions", partitions)  # noqa: B010
        await engine.dispose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", required=True, help="postgresql+asyncpg:// URL of a database")
    parser.add_argument("--base", required=True, help="the other tree (a checkout of main)")
    parser.add_argument("--fill", type=int, default=0, help="exchanges a day to fill first")
    parser.add_argument("--days", type=int, default=4, help="days to fill")
    parser.add_argument("--rounds", type=int, default=4, help="folds of each side")
    parser.add_argument("--prune", action="store_true", help="prune the days, sides in turn")
    args = parser.parse_args()
    await run(args.pg, args.base, args.fill, args.days, args.rounds, args.prune)


if __name__ == "__main__":
    asyncio.run(main())
