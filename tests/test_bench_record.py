"""`bench.bench_record` against real databases: a measure has written every record it times,
however they are handed over, and the PostgreSQL server's CPU it adds to a PostgreSQL measure
counts the work of the database's own backends."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest

from bench.bench_record import dsn, measure, postgres_cpu, server_pids
from proxy.store import upgrade
from tests import dbs

pg_url = dbs.pg_url  # fixture


@pytest.mark.parametrize("per_turn", [64, 0])
async def test_a_measure_times_every_record_written(tmp_path: Path, per_turn: int) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path}/bench.db"
    await upgrade(url)
    found = await measure(url, tmp_path / "bench.spool", 300, 3, per_turn)
    with sqlite3.connect(tmp_path / "bench.db") as db:
        exchanges = db.execute("SELECT count(*) FROM exchanges").fetchone()[0]
        tokens = db.execute("SELECT count(*) FROM logprobs").fetchone()[0]
    assert (exchanges, tokens) == (300, 900)
    assert found["per_s"] > 0 and found["cpu_ms"] > 0


async def test_the_server_cpu_is_that_of_the_databases_backends(pg_url: str) -> None:
    conn = await asyncpg.connect(dsn(pg_url))
    try:
        backend = await conn.fetchval("SELECT pg_backend_pid()")
        before = postgres_cpu()
        if backend not in before:
            pytest.skip("the server's processes are not visible here: it runs elsewhere")
        await conn.fetchval("SELECT count(*) FROM generate_series(1, 4000000)")
        after = postgres_cpu()
        pids = await server_pids(pg_url)
    finally:
        await conn.close()
    assert after[backend] - before[backend] >= 0.1  # four million rows: tenths of a second
    assert backend in pids  # the database's backend; the one asking is not among them
    assert len(pids) == len(set(pids)) >= 2  # and the WAL writer or the checkpointer
