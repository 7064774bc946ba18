"""`bench.bench_record`'s reading of the PostgreSQL server's CPU, against a real server: the
figure it adds to a PostgreSQL measure must count the work of the database's own backends."""

from __future__ import annotations

import asyncpg  # type: ignore[import-untyped]
import pytest

from bench.bench_record import dsn, postgres_cpu, server_pids
from tests import dbs

pg_url = dbs.pg_url  # fixture


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
