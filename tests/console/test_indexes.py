"""Migration 0003: partial indexes for the console's failure filters, on both engines, used by
the list query (SQLite's plan names them), and gone after a downgrade."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from proxy.store import create_engine, downgrade, upgrade
from proxy.store.browse import ListFilters, _summary_query
from tests import dbs
from tests.store.test_migrations import index_definitions

db_url = dbs.db_url  # fixture


async def test_failure_indexes_are_partial_and_go_on_downgrade(db_url: str) -> None:
    await upgrade(db_url)
    found = await index_definitions(db_url)
    assert "'ok'" in found["ix_exchanges_outcome_started_at"]
    assert "400" in found["ix_exchanges_status_started_at"]
    await downgrade(db_url, "0002")
    found = await index_definitions(db_url)
    assert "ix_exchanges_outcome_started_at" not in found
    assert "ix_exchanges_status_started_at" not in found


async def test_the_list_query_uses_them_on_sqlite(tmp_path: Path) -> None:
    url = dbs.sqlite_url(tmp_path / "plan.db")
    await upgrade(url)
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            for filters, index in (
                (ListFilters(outcome="timeout"), "ix_exchanges_outcome_started_at"),
                (ListFilters(status=503), "ix_exchanges_status_started_at"),
            ):
                query = _summary_query(filters).limit(51)
                sql = query.compile(conn.sync_connection, compile_kwargs={"literal_binds": True})
                plan = await conn.execute(sa.text(f"EXPLAIN QUERY PLAN {sql}"))
                assert index in " ".join(str(row) for row in plan), filters
    finally:
        await engine.dispose()
