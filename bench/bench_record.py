"""Recording throughput: exchanges per second written by the database recorder.

    python -m bench.bench_record [--pg postgresql+asyncpg://user@host/db] [--count N]
        [--engine sqlite|postgresql] [--workload plain|logprobs] [--rounds R] [--base DIR]

For each engine (a SQLite file in a temporary directory; PostgreSQL when `--pg` is given, in a
throwaway database created next to the one named and dropped afterwards) and each workload
(plain chat completions; chat completions with 100 logprob tokens, 5 top_logprobs each), it
records N exchanges through `DatabaseRecorder.record()` as the relay does and times until
`close()` has written them all: queue, journal, batching, row building, the transactions. The
records come `--per-turn` at a time (64 by default), a turn of the event loop between, as a
server's requests end across its loop's turns; `--per-turn 0` hands all N over in one turn, as
this bench did before 2026-11-28, which a server never does: the journal then encodes and
appends every record in one write before the writer starts (docs/performance.md). It also
reports what `record()` costs the relay per call and the recording process's own CPU per
exchange; for PostgreSQL on this machine also the server's (`postgres_cpu` of the database's
backends, read once the records are in and before the recorder's connections close, and of
the WAL writer and the checkpointer, which work for other databases too: a quiet server).

Each measure runs in a fresh process. With `--base DIR` every measure runs for DIR's checkout
too, this checkout and DIR alternating, `--rounds` times, and the medians and their ratio are
printed: an A/B in one run on a machine whose load moves. Goals (issue 36): >= 20,000 plain/s
on each engine, with logprobs >= 2,000/s on SQLite and >= 3,000/s on PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import orjson
from sqlalchemy.engine import make_url

from bench.procs import pythonpath
from proxy.config import Config
from proxy.exchange import Exchange
from proxy.store import upgrade
from proxy.store.recorder import DatabaseRecorder

ROOT = Path(__file__).resolve().parent.parent

GOALS = {
    ("sqlite", "plain"): 20_000,
    ("sqlite", "logprobs"): 2_000,
    ("postgresql", "plain"): 20_000,
    ("postgresql", "logprobs"): 3_000,
}
WORKLOADS = {"plain": 0, "logprobs": 100}
"""Logprob tokens per exchange."""
PER_TURN = 64
"""Records handed to the recorder per turn of the event loop (`--per-turn`): about what a
worker's loop ends in one turn at 64 connections."""


def exchange(logprob_tokens: int) -> Exchange:
    ex = Exchange.start("POST", "/v1/chat/completions", "", "openai")
    ex.model = "gpt-4o-mini"
    ex.request_json = {
        "model": ex.model,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant. " * 4},
            {"role": "user", "content": "Explain what a reverse proxy does, briefly."},
        ],
        "logprobs": bool(logprob_tokens),
    }
    tokens = [
        {
            "token": f" tok{i}",
            "logprob": -0.01 * i,
            "bytes": list(f" tok{i}".encode()),
            "top_logprobs": [
                {"token": f" alt{j}", "logprob": -0.5 * j, "bytes": list(f" alt{j}".encode())}
                for j in range(5)
            ],
        }
        for i in range(logprob_tokens)
    ]
    usage = {
        "prompt_tokens": 42,
        "completion_tokens": logprob_tokens or 60,
        "total_tokens": 42 + (logprob_tokens or 60),
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
    }
    ex.response_json = {
        "id": "chatcmpl-" + ex.id[-12:],
        "object": "chat.completion",
        "created": int(ex.started_at),
        "model": "gpt-4o-mini-2024-07-18",
        "system_fingerprint": "fp_bench",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "A reverse proxy sits... " * 10},
                "logprobs": {"content": tokens} if tokens else None,
                "finish_reason": "stop",
            }
        ],
        "usage": usage,
    }
    ex.request_body = orjson.dumps(ex.request_json)
    ex.response_body = orjson.dumps(ex.response_json)
    ex.status, ex.usage, ex.usage_source = 200, usage, "reported"
    ex.response_model, ex.system_fingerprint = "gpt-4o-mini-2024-07-18", "fp_bench"
    ex.key_hash, ex.key_hint, ex.ttfb_ms, ex.duration_ms = "ab12" * 4, "sk-...a1b2", 80.0, 900.0
    return ex


async def measure(
    url: str, spool: Path, count: int, logprob_tokens: int, per_turn: int = PER_TURN
) -> dict[str, float]:
    """Exchanges written per second, microseconds per record() call, CPU ms per exchange (the
    process's, and for PostgreSQL the server's where it runs here). The records go to the
    recorder `per_turn` at a time, the loop turning between (0: all in one turn)."""
    config = replace(
        Config(), db_url=url, spool_path=str(spool), queue_size=count, shutdown_grace=600.0
    )
    recorder = DatabaseRecorder(config)
    await recorder.start()
    # The collector and threads as `serve` runs them: what lives from start-up frozen, young
    # collections every 20,000 allocations. The exchanges are made after, as a server's are.
    serve = importlib.import_module("proxy.serve")
    tune_gc = getattr(serve, "tune_gc", None) or serve._tune_gc  # a base checkout's name
    tune_gc()
    getattr(serve, "tune_threads", lambda: None)()  # the switch interval, where serve sets one
    exchanges = [exchange(logprob_tokens) for _ in range(count)]
    began = postgres_cpu() if url.startswith("postgresql") else {}
    cpu = time.process_time()
    begin = time.perf_counter()
    for n, ex in enumerate(exchanges, 1):
        recorder.accept(ex)
        if per_turn and n % per_turn == 0:
            await asyncio.sleep(0)  # the loop turns: the journal and the writer run
    recorded = time.perf_counter()
    if began:  # the server runs here: its backends end with the recorder's pool
        await written(recorder, count, config.shutdown_grace)
        pids, ended = await server_pids(url), postgres_cpu()
    await recorder.stop()
    end = time.perf_counter()
    found = {
        "per_s": count / (end - begin),
        "record_us": (recorded - begin) / count * 1e6,
        "cpu_ms": (time.process_time() - cpu) / count * 1e3,
    }
    if began:
        used = sum(ended.get(pid, 0.0) - began.get(pid, 0.0) for pid in pids)
        found["server_cpu_ms"] = used / count * 1e3
    return found


async def written(recorder: DatabaseRecorder, count: int, grace: float) -> None:
    """Wait until the recorder has written `count` exchanges (at most `grace` seconds)."""
    async with asyncio.timeout(grace):
        while recorder.written < count:  # noqa: ASYNC110 (a count, with no event to wait on)
            await asyncio.sleep(0.01)


SERVER_PIDS = (
    "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND (datname = "
    "current_database() OR backend_type IN ('walwriter', 'checkpointer', 'background writer'))"
)
"""The server's processes that work for a recorder writing to this database."""


async def server_pids(url: str) -> list[int]:
    """The pids of `SERVER_PIDS` for the database `url` names."""
    conn = await asyncpg.connect(dsn(url))
    try:
        return [row[0] for row in await conn.fetch(SERVER_PIDS)]
    finally:
        await conn.close()


def postgres_cpu() -> dict[int, float]:
    """CPU seconds used so far by each `postgres` process on this machine, by pid (none where
    the server runs elsewhere)."""
    found = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        name_ends = stat.rfind(b")")
        if stat[stat.find(b"(") + 1 : name_ends] == b"postgres":
            fields = stat[name_ends + 2 :].split()  # from the state on: utime, stime at 11, 12
            found[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    return found


def counted(workload: str, count: int) -> int:
    """Exchanges a measure writes: fewer with logprobs, each is a hundred rows more."""
    return count if workload == "plain" else max(count // 5, 200)


async def one(
    engine: str, workload: str, count: int, pg: str | None, per_turn: int = PER_TURN
) -> dict[str, float]:
    """One measure against a fresh database, in this process."""
    with tempfile.TemporaryDirectory() as tmp:
        spool = Path(tmp) / "bench.spool"
        if engine == "sqlite":
            url = f"sqlite+aiosqlite:///{tmp}/bench.db"
            await upgrade(url)
            return await measure(
                url, spool, counted(workload, count), WORKLOADS[workload], per_turn
            )
        if pg is None:
            raise SystemExit("postgresql needs --pg")
        async with pg_database(pg) as url:
            await upgrade(url)
            return await measure(
                url, spool, counted(workload, count), WORKLOADS[workload], per_turn
            )


def dsn(url: str) -> str:
    """asyncpg's form of a `postgresql+asyncpg://` URL."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextlib.asynccontextmanager
async def pg_database(base: str) -> AsyncIterator[str]:
    """A throwaway database next to `base`'s, dropped afterwards."""
    url = make_url(base)
    admin = await asyncpg.connect(dsn(base))
    name = f"flightrec_bench_{uuid.uuid4().hex[:10]}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url.set(database=name).render_as_string(False)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def run_one(checkout: Path, engine: str, workload: str, args: argparse.Namespace) -> dict[str, Any]:
    """One measure in a fresh process running `checkout`'s code."""
    command = [sys.executable, "-m", "bench.bench_record", "--one", engine, workload]
    command += ["--count", str(args.count)] + (["--pg", args.pg] if args.pg else [])
    command += ["--per-turn", str(args.per_turn)]  # always: both sides fed the same way
    env = {**os.environ, "PYTHONPATH": pythonpath(checkout)}
    done = subprocess.run(
        command, cwd=checkout, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0 and "--per-turn" in done.stderr:
        raise SystemExit(
            f"{checkout}: its bench/bench_record.py hands the records over in one turn; copy "
            "this one there (cp bench/bench_record.py DIR/bench/) so both are fed alike"
        )
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: {engine} {workload} failed:\n{done.stderr[-2000:]}")
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def line(label: str, engine: str, workload: str, found: dict[str, float], n: int) -> str:
    goal = GOALS[(engine, workload)]
    verdict = "ok" if found["per_s"] >= goal else f"BELOW GOAL {goal:,}/s"
    return (
        f"{label:<8} {engine:<10} {workload:<9} {n:>6} exchanges  {found['per_s']:>9,.0f}/s  "
        f"record() {found['record_us']:5.1f} us  CPU {found['cpu_ms']:6.3f} ms/exchange  "
        + (f"server {found['server_cpu_ms']:6.3f} ms  " if "server_cpu_ms" in found else "")
        + verdict
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", help="postgresql+asyncpg:// URL of a server to bench on")
    parser.add_argument("--count", type=int, default=20_000, help="plain exchanges per run")
    parser.add_argument("--engine", choices=("sqlite", "postgresql"), action="append")
    parser.add_argument("--workload", choices=tuple(WORKLOADS), action="append")
    parser.add_argument("--rounds", type=int, default=1, help="measures of each, alternated")
    parser.add_argument("--base", type=Path, help="another checkout to measure alternately")
    parser.add_argument(
        "--per-turn",
        type=int,
        default=PER_TURN,
        help="records handed over per turn of the event loop (0: all in one turn)",
    )
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        engine, workload = args.one
        print(json.dumps(asyncio.run(one(engine, workload, args.count, args.pg, args.per_turn))))
        return
    engines = args.engine or (["sqlite", "postgresql"] if args.pg else ["sqlite"])
    checkouts = [("this", ROOT)] + ([("base", args.base.resolve())] if args.base else [])
    for engine in engines:
        for workload in args.workload or list(WORKLOADS):
            n = counted(workload, args.count)
            seen: dict[str, list[dict[str, float]]] = {label: [] for label, _ in checkouts}
            for turn in range(args.rounds):
                order = checkouts if turn % 2 == 0 else checkouts[::-1]
                for label, checkout in order:
                    found = run_one(checkout, engine, workload, args)
                    seen[label].append(found)
                    print(line(label, engine, workload, found, n), flush=True)
            summary(engine, workload, n, seen)


def summary(engine: str, workload: str, n: int, seen: dict[str, list[dict[str, float]]]) -> None:
    medians = {
        label: {
            key: statistics.median(f[key] for f in found)
            for key in found[0]
            if all(key in f for f in found)  # a base checkout may not measure the server
        }
        for label, found in seen.items()
    }
    for label, found in medians.items():
        print(line(f"med {label}", engine, workload, found, n))
    if "base" in medians:
        this, base = medians["this"], medians["base"]
        server = ""
        if "server_cpu_ms" in this and "server_cpu_ms" in base:
            server = f", {this['server_cpu_ms'] / base['server_cpu_ms']:.2f}x the server's"
        print(
            f"{'':<8} {engine:<10} {workload:<9} this/base: {this['per_s'] / base['per_s']:.2f}x "
            f"the rate, {this['cpu_ms'] / base['cpu_ms']:.2f}x the CPU per exchange{server}",
            flush=True,
        )


if __name__ == "__main__":
    main()
