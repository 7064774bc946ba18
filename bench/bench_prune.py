"""Pruning a big database while the proxy takes traffic: p99 latency, writer stalls, losses.

    python -m bench.bench_prune [--pg postgresql+asyncpg://user@host/db] [--rows N]
        [--quiet-seconds S] [--no-sqlite]

For each engine (a SQLite file in a temporary directory; PostgreSQL when `--pg` is given, in a
throwaway database dropped afterwards) it fills N exchanges (default 1,000,000) with the
console bench's generator (90 days of 2025: request bodies, answers, usage, tags), starts the
bench's mock upstream and a real `flightrec serve` on that database, and drives the proxy at
c=8 through `bench/load.py` (closed loop, `GAP_MS` between one connection's requests, chat
completions without streaming):

1. quiet: retention off, `--quiet-seconds` of traffic;
2. pruning: `flightrec serve` started again with `retention_days = 1`, so every generated
   exchange is due; traffic in chunks of `CHUNK_S` until the proxy's log says it pruned all N.

Meanwhile a probe, in the bench's own process, inserts one row into a table of its own every
`PROBE_EVERY_S` in its own transaction and times each insert: the longest is the longest a
writer waited (for SQLite's write lock, polled every millisecond; on PostgreSQL deletes take
row locks, which an insert never waits for). The proxy's log also gives the longest batch the
pruner ran, what held SQLite's write lock (its transaction and the reads before it).
After each phase the proxy is stopped (SIGTERM flushes its records) and the bench checks that
every answered request has its exchange; after pruning, that no generated exchange is left and
that the cost report over the generated period (per day and per model) is what it was before.
Goals (issue 22): p99 within 2 ms of quiet, no writer stall over
100 ms, nothing lost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from proxy.store import create_engine
from proxy.store import tables as t
from proxy.store.filters import Filters
from proxy.store.report import cost_report

from . import bench_console, bench_cost, procs
from .__main__ import LoadWorker
from .load import percentile

CONCURRENCY = 8
GAP_MS = 10.0
CHUNK_S = 20.0
PROBE_EVERY_S = 0.01
GENERATED_UNTIL = datetime(2026, 1, 1, tzinfo=UTC)
"""Every generated exchange started before this (bench_cost.START + 90 days)."""


class Probe:
    """A writer of its own: one insert per transaction, timed, in a thread."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        if self.url.startswith("sqlite"):
            self._sqlite(make_url(self.url).database or "")
        else:
            asyncio.run(self._pg())

    def _sqlite(self, path: str) -> None:
        db = sqlite3.connect(path, timeout=30, isolation_level=None)
        db.execute("CREATE TABLE IF NOT EXISTS bench_probe (at REAL)")
        db.execute("PRAGMA busy_timeout = 0")  # polled below: SQLite's own waits grow to 100 ms
        while not self._stop.wait(PROBE_EVERY_S):
            began = time.perf_counter()
            for _ in range(30_000):  # every millisecond, up to 30 s
                with contextlib.suppress(sqlite3.OperationalError):
                    db.execute("BEGIN IMMEDIATE")
                    break
                time.sleep(0.001)
            db.execute("INSERT INTO bench_probe VALUES (?)", (began,))
            db.execute("COMMIT")
            self.times.append(time.perf_counter() - began)
        db.close()

    async def _pg(self) -> None:
        conn = await asyncpg.connect(_dsn(self.url))
        await conn.execute("CREATE TABLE IF NOT EXISTS bench_probe (at double precision)")
        while not self._stop.wait(PROBE_EVERY_S):
            began = time.perf_counter()
            await conn.execute("INSERT INTO bench_probe VALUES ($1)", began)
            self.times.append(time.perf_counter() - began)
        await conn.close()

    def summary(self) -> dict[str, float]:
        found = sorted(self.times)
        return {
            "writes": len(found),
            "stall_max_ms": found[-1] * 1000,
            "stall_p999_ms": found[int(len(found) * 0.999)] * 1000,
        }


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextlib.contextmanager
def flightrec(url: str, upstream: int, work: Path, name: str, **env: str) -> Iterator[Any]:
    """A real `flightrec serve` on `url`, stopped (records flushed) when the block ends."""
    port = procs.free_port()
    argv = [sys.executable, "-m", "proxy", "serve", "--port", str(port)]
    argv += ["--upstream", f"http://127.0.0.1:{upstream}/v1", "--db", url]
    env |= {"FLIGHTREC_SPOOL_PATH": str(work / f"{name}.spool"), "FLIGHTREC_CONSOLE_PORT": "0"}
    target = procs.Target(name, "flightrec serve", argv, port, env, ready_path="/readyz")
    procs.start(target, work)
    try:
        procs.wait_ready(target)
        yield target
    finally:
        procs.stop(target, grace=60)


def traffic(load: LoadWorker, port: int, seconds: float) -> dict[str, Any]:
    return load.run(
        op="closed", port=port, path="/v1/chat/completions", concurrency=CONCURRENCY,
        requests=10**9, seconds=seconds, warmup=0, gap_ms=GAP_MS, raw=True,
    )  # fmt: skip


def summary(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    latencies = sorted(ns for chunk in chunks for ns in chunk["latencies_ns"])
    return {
        "requests": len(latencies) + sum(chunk["errors"] for chunk in chunks),
        "errors": sum(chunk["errors"] for chunk in chunks),
        "p50_ms": percentile(latencies, 50) / 1e6,
        "p99_ms": percentile(latencies, 99) / 1e6,
        "max_ms": latencies[-1] / 1e6,
        "seconds": sum(chunk["elapsed_s"] for chunk in chunks),
    }


async def counts(url: str, since: datetime) -> tuple[int, int]:
    """(exchanges started since `since`, generated exchanges left)."""
    engine = create_engine(url)
    ex = t.exchanges
    try:
        async with engine.connect() as conn:
            new = await conn.scalar(sa.select(sa.func.count()).where(ex.c.started_at >= since))
            old = await conn.scalar(
                sa.select(sa.func.count()).where(ex.c.started_at < GENERATED_UNTIL)
            )
        return int(new or 0), int(old or 0)
    finally:
        await engine.dispose()


async def reports(url: str) -> list[Any]:
    engine = create_engine(url)
    try:
        until = Filters(until=GENERATED_UNTIL)
        return [await cost_report(engine, by, until) for by in ("day", "model")]
    finally:
        await engine.dispose()


def phase(
    name: str, url: str, upstream: int, work: Path, load: LoadWorker, seconds: float, **env: str
) -> dict[str, Any]:
    """Traffic for `seconds` (or, with retention on, until everything is pruned)."""
    began = datetime.now(UTC)
    chunks: list[dict[str, Any]] = []
    with flightrec(url, upstream, work, name, **env) as target, Probe(url) as probe:
        log = Path(target.log_path)
        deadline = time.monotonic() + seconds
        for _ in range(100_000):  # bounded: pruning 1M takes minutes
            chunks.append(traffic(load, target.port, CHUNK_S))
            done = "retention: pruned" in log.read_text() if env else time.monotonic() > deadline
            if done:
                break
    found = summary(chunks) | probe.summary()
    found["recorded"], found["generated_left"] = asyncio.run(counts(url, began))
    found["lost"] = found["requests"] - found["recorded"]
    if env:
        found["prune_log"] = [
            line.split("retention: ", 1)[1]
            for line in log.read_text().splitlines()
            if "retention: " in line
        ]
    print(f"{name:<22} {found}", flush=True)
    return found


def run_engine(name: str, url: str, work: Path, quiet_seconds: float) -> dict[str, Any]:
    before = asyncio.run(reports(url))
    upstream = procs.mock_upstream()
    procs.start(upstream, work)
    load = LoadWorker()
    try:
        procs.wait_ready(upstream)
        quiet = phase(f"{name} quiet", url, upstream.port, work, load, quiet_seconds)
        pruning = phase(
            f"{name} pruning", url, upstream.port, work, load, 0, FLIGHTREC_RETENTION_DAYS="1"
        )
    finally:
        load.close()
        procs.stop(upstream)
    pruning["reports_unchanged"] = asyncio.run(reports(url)) == before
    pruning["p99_delta_ms"] = pruning["p99_ms"] - quiet["p99_ms"]
    print(f"{name:<22} p99 +{pruning['p99_delta_ms']:.2f} ms while pruning, reports unchanged:"
          f" {pruning['reports_unchanged']}", flush=True)  # fmt: skip
    return {"quiet": quiet, "pruning": pruning}


async def _fill_sqlite(tmp: str, rows: int) -> str:
    return await bench_cost.filled_sqlite(tmp, rows, bench_console.fill_sqlite)


async def _pg(base: str, rows: int, work: Path, quiet: float) -> dict[str, Any]:
    async with bench_cost.filled_pg(base, rows, bench_console.fill_pg) as url:
        return await asyncio.to_thread(run_engine, "postgresql", url, work, quiet)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", help="postgresql+asyncpg:// URL of a server to bench on")
    parser.add_argument("--rows", type=int, default=1_000_000, help="exchanges to generate")
    parser.add_argument("--quiet-seconds", type=float, default=60.0, help="traffic, no pruning")
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if not args.no_sqlite:
            url = asyncio.run(_fill_sqlite(tmp, args.rows))
            run_engine("sqlite", url, work, args.quiet_seconds)
        if args.pg:
            asyncio.run(_pg(args.pg, args.rows, work, args.quiet_seconds))


if __name__ == "__main__":
    main()
