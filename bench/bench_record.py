"""Recording throughput: exchanges per second written by the database recorder.

    python -m bench.bench_record [--pg postgresql+asyncpg://user@host/db] [--count N]

For each engine (a SQLite file in a temporary directory; PostgreSQL when `--pg` is given, in a
throwaway database created next to the one named and dropped afterwards) and each workload
(plain chat completions; chat completions with 100 logprob tokens, 5 top_logprobs each), it
records N exchanges through `DatabaseRecorder.record()` as the relay does and times until
`close()` has written them all: queue, batching, row building, the transactions. It also
reports what `record()` costs the relay per call. Goals: >= 3,000 plain/s, >= 300/s with
logprobs, on each engine.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import orjson
from sqlalchemy.engine import make_url

from proxy.config import Config
from proxy.exchange import Exchange
from proxy.store import upgrade
from proxy.store.recorder import DatabaseRecorder

GOALS = {"plain": 3000, "logprobs": 300}


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


async def measure(url: str, spool: Path, count: int, logprob_tokens: int) -> tuple[float, float]:
    """(exchanges written per second, microseconds per record() call)."""
    exchanges = [exchange(logprob_tokens) for _ in range(count)]
    config = replace(
        Config(), db_url=url, spool_path=str(spool), queue_size=count, shutdown_grace=600.0
    )
    recorder = DatabaseRecorder(config)
    await recorder.start()
    begin = time.perf_counter()
    for ex in exchanges:
        recorder.accept(ex)
    recorded = time.perf_counter()
    await recorder.stop()
    end = time.perf_counter()
    return count / (end - begin), (recorded - begin) / count * 1e6


async def run_engine(name: str, url: str, count: int, spool: Path) -> list[dict[str, Any]]:
    await upgrade(url)
    results = []
    for workload, tokens, n in (("plain", 0, count), ("logprobs", 100, max(count // 5, 200))):
        rate, per_call = await measure(url, spool, n, tokens)
        goal = GOALS[workload]
        results.append({"engine": name, "workload": workload, "exchanges": n, "per_s": rate})
        verdict = "ok" if rate >= goal else f"BELOW GOAL {goal}/s"
        print(
            f"{name:<10} {workload:<9} {n:>6} exchanges  {rate:>9,.0f}/s  "
            f"record() {per_call:5.1f} us  {verdict}",
            flush=True,
        )
    return results


async def with_pg_database(base: str, count: int, spool: Path) -> None:
    url = make_url(base)
    admin = await asyncpg.connect(url.set(drivername="postgresql").render_as_string(False))
    name = f"flightrec_bench_{uuid.uuid4().hex[:10]}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        await run_engine("postgresql", url.set(database=name).render_as_string(False), count, spool)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg", help="postgresql+asyncpg:// URL of a server to bench on")
    parser.add_argument("--count", type=int, default=20_000, help="plain exchanges per run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        spool = Path(tmp) / "bench.spool"
        await run_engine("sqlite", f"sqlite+aiosqlite:///{tmp}/bench.db", args.count, spool)
        if args.pg:
            await with_pg_database(args.pg, args.count, spool)


if __name__ == "__main__":
    asyncio.run(main())
