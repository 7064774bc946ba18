"""Migrations: empty -> head -> base on both engines, models agree with the scripts, and the
scripts are found the way an installed wheel lays them out."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection, make_url

from proxy.store import StoreError, Unreachable, check_connection, create_engine, downgrade, upgrade
from proxy.store.migrate import current, head, scripts_dir
from proxy.store.tables import metadata
from tests import dbs
from tests.dbs import chat_exchange, sqlite_url, store

db_url = dbs.db_url  # fixture
pg_url = dbs.pg_url  # fixture

REPO = Path(__file__).resolve().parents[2]
TABLES = {
    "exchanges",
    "tags",
    "completions",
    "choices",
    "usage",
    "logprobs",
    "raw_streams",
    "fingerprints",
    "rollups",
    "rollup_tags",
    "alert_state",
    "alert_events",
    "facets",
    "batch_requests",
    "batches",
    "batch_results",
}


PARTITION = re.compile(r"_(p\d{8}|default)$")
"""A partition's name (PostgreSQL, migration 0010): a part of a table, not a table of its own."""


async def table_names(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda c: sa.inspect(c).get_table_names())
            return {name for name in names if not PARTITION.search(name)}
    finally:
        await engine.dispose()


async def revision(url: str) -> str | None:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return await current(conn)
    finally:
        await engine.dispose()


async def test_upgrade_to_head_and_downgrade_to_base(db_url: str) -> None:
    assert await revision(db_url) is None
    await upgrade(db_url)
    assert await table_names(db_url) == TABLES | {"alembic_version"}
    assert await revision(db_url) == head()

    await upgrade(db_url)  # already at head: nothing to do, no error
    assert await revision(db_url) == head()

    await downgrade(db_url, "base")
    assert await table_names(db_url) - {"alembic_version"} == set()
    assert await revision(db_url) is None

    await upgrade(db_url)  # and back up again from base
    assert await table_names(db_url) == TABLES | {"alembic_version"}


async def test_models_and_migrations_agree(db_url: str) -> None:
    await upgrade(db_url)

    def diff(conn: Connection) -> list[object]:
        def whole(name: str | None, kind: str, parent: Any) -> bool:
            return not (kind == "table" and name and PARTITION.search(name))

        def not_a_copy(found: Any, name: str | None, kind: str, *_: Any) -> bool:
            # PostgreSQL copies a foreign key for each partition of the table it refers to.
            refers = found.referred_table.name if kind == "foreign_key_constraint" else ""
            # The models keep the children's keys to `exchanges`, which SQLite keeps; on
            # PostgreSQL migration 0012 drops them (`test_children_lose_their_keys_...`).
            unchecked = refers == "exchanges" and conn.dialect.name == "postgresql"
            return not PARTITION.search(refers) and not unchecked

        opts = {"compare_type": True, "include_name": whole, "include_object": not_a_copy}
        context = MigrationContext.configure(conn, opts=opts)
        return list(compare_metadata(context, metadata))

    engine = create_engine(db_url)
    try:
        async with engine.connect() as conn:
            differences = await conn.run_sync(diff)
    finally:
        await engine.dispose()
    assert differences == []


async def test_processes_upgrading_at_once_do_not_collide(pg_url: str) -> None:
    await asyncio.gather(*(upgrade(pg_url) for _ in range(4)))
    assert await revision(pg_url) == head()


async def test_unreachable_database_is_one_clear_error() -> None:
    url = "postgresql+asyncpg://nobody@127.0.0.1:9/none"
    with pytest.raises(Unreachable, match=r"cannot connect to the database at .*127\.0\.0\.1:9"):
        await upgrade(url)


async def _connect_error(url: str) -> StoreError:
    engine = create_engine(url)
    try:
        await check_connection(engine)
    except StoreError as exc:
        return exc
    finally:
        await engine.dispose()
    raise AssertionError(f"{url} answered")


async def test_a_server_that_may_answer_later_is_told_from_one_that_refuses(pg_url: str) -> None:
    """`serve` waits for the first kind (`Unreachable`) and stops at once for the second."""
    server = make_url(pg_url)
    later = [
        server.set(port=9),  # refused
        server.set(host="flightrec-no-such-host.invalid"),  # not in DNS (yet)
        server.set(host=None, query={"host": "/nonexistent"}),  # a Unix socket not made yet
    ]
    refused = [
        server.set(database="flightrec_no_such_database"),
        server.set(username="flightrec_no_such_role"),
    ]
    for url in later:
        error = await _connect_error(url.render_as_string(hide_password=False))
        assert isinstance(error, Unreachable), error
    for url in refused:
        error = await _connect_error(url.render_as_string(hide_password=False))
        assert not isinstance(error, Unreachable), error
    tls = server.update_query_dict({"ssl": "require"}).render_as_string(hide_password=False)
    try:
        error = await _connect_error(tls)
    except AssertionError:
        pytest.skip("this PostgreSQL speaks TLS: no TLS refusal to try")
    assert "SSL" in str(error) and not isinstance(error, Unreachable), error


async def test_unknown_revision_is_a_store_error(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="migration upgrade to nope failed"):
        await upgrade(sqlite_url(tmp_path / "x.db"), "nope")


def test_scripts_found_in_a_checkout() -> None:
    assert scripts_dir() == REPO / "migrations"


def test_scripts_found_in_an_installed_layout(tmp_path: Path) -> None:
    # The wheel ships `migrations` as `proxy/_migrations` (pyproject force-include): lay the
    # package out that way, away from the checkout, and migrate a database from there.
    site = tmp_path / "site"
    shutil.copytree(REPO / "proxy", site / "proxy", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(
        REPO / "migrations",
        site / "proxy" / "_migrations",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    db = tmp_path / "installed.db"
    script = (
        "import asyncio, sys\n"
        "from proxy.store.migrate import scripts_dir, upgrade\n"
        "print(scripts_dir())\n"
        "asyncio.run(upgrade(sys.argv[1]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", script, sqlite_url(db)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(site / "proxy" / "_migrations")
    assert asyncio.run(table_names(sqlite_url(db))) == TABLES | {"alembic_version"}


async def index_definitions(url: str) -> dict[str, str]:
    """Each index on `exchanges` by name, with its definition as the database keeps it."""
    engine = create_engine(url)
    sql = (
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'exchanges'"
        if url.startswith("postgresql")
        else "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'exchanges'"
    )
    try:
        async with engine.connect() as conn:
            return {name: definition or "" for name, definition in await conn.execute(sa.text(sql))}
    finally:
        await engine.dispose()


async def test_0002_makes_the_user_and_replay_indexes_partial_and_back(db_url: str) -> None:
    await upgrade(db_url)
    found = await index_definitions(db_url)
    assert "ix_exchanges_upstream_started_at" not in found
    assert "end_user IS NOT NULL" in found["ix_exchanges_end_user_started_at"]
    assert "replay_of IS NOT NULL" in found["ix_exchanges_replay_of"]
    assert "WHERE" not in found["ix_exchanges_model_started_at"]

    await downgrade(db_url, "0001")
    found = await index_definitions(db_url)
    assert "ix_exchanges_upstream_started_at" in found
    assert "WHERE" not in found["ix_exchanges_end_user_started_at"]
    assert "WHERE" not in found["ix_exchanges_replay_of"]


CHILDREN = ("tags", "completions", "choices", "usage", "logprobs", "raw_streams")


async def foreign_keys(url: str) -> dict[str, int]:
    """The keys from each child table to `exchanges` (PostgreSQL: not the partitions' copies)."""
    engine = create_engine(url)
    found: dict[str, int] = {}
    try:
        async with engine.connect() as conn:
            for table in CHILDREN:
                if conn.dialect.name == "sqlite":
                    listed = await conn.exec_driver_sql(f"PRAGMA foreign_key_list({table})")
                    found[table] = [r._mapping["table"] for r in listed].count("exchanges")
                    continue
                counted = await conn.exec_driver_sql(
                    "SELECT count(*) FROM pg_constraint WHERE conrelid = to_regclass($1) "
                    "AND contype = 'f' AND conparentid = 0",
                    (table,),
                )
                found[table] = int(counted.scalar_one())
    finally:
        await engine.dispose()
    return found


async def test_children_lose_their_keys_to_exchanges_on_postgresql_only(db_url: str) -> None:
    """Migration 0012 on a database with records: rows kept, written once, keys gone on
    PostgreSQL (and back on downgrade), kept on SQLite."""
    await upgrade(db_url, "0010")
    written = [chat_exchange(logprobs=["a", "b", "c"], tags={"team": "red"}) for _ in range(3)]
    assert await store(db_url, written) == 3
    before = await row_counts(db_url)
    assert before["logprobs"] == 9
    assert await foreign_keys(db_url) == dict.fromkeys(CHILDREN, 1)

    await upgrade(db_url)
    assert await revision(db_url) == head()
    assert await row_counts(db_url) == before
    postgresql = make_url(db_url).get_backend_name() == "postgresql"
    assert await foreign_keys(db_url) == dict.fromkeys(CHILDREN, 0 if postgresql else 1)
    assert await store(db_url, written) == 0  # still idempotent by id
    assert await store(db_url, [chat_exchange(logprobs=["d"])]) == 1
    after = await row_counts(db_url)
    assert after["logprobs"] == 10 and after["exchanges"] == 4

    await downgrade(db_url, "0010")
    assert await foreign_keys(db_url) == dict.fromkeys(CHILDREN, 1)
    assert await row_counts(db_url) == after


async def row_counts(url: str) -> dict[str, int]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            found = {}
            for table in ("exchanges", *CHILDREN):
                counted = await conn.exec_driver_sql(f"SELECT count(*) FROM {table}")
                found[table] = int(counted.scalar_one())
            return found
    finally:
        await engine.dispose()


async def test_0008_fills_the_sums_from_stored_exchanges_as_the_writer_keeps_them(
    db_url: str,
) -> None:
    """The facet sums the writer kept for its exchanges, dropped (down to 0009) and made again
    by 0008 from the stored exchanges: the same rows."""
    from proxy.store import tables as t

    await upgrade(db_url)
    exchanges = [
        chat_exchange(
            started_at=1_790_000_000 + 1800 * i,
            model=("gpt-4o-mini", "gpt-4o")[i % 2],
            user=f"user-{i % 3}",
            key_hash=("a" if i % 2 else "b") * 64,
            tags={"team": "red" if i % 3 else "blue"},
            duration_ms=50.0 + 40 * i,
        )
        for i in range(60)
    ]
    assert await store(db_url, exchanges) == 60

    async def sums() -> list[tuple[Any, ...]]:
        engine = create_engine(db_url)
        f = t.facets
        query = sa.select(f).where(f.c.span.in_(("hour", "day"))).order_by(*f.primary_key)
        try:
            async with engine.connect() as conn:
                return [tuple(row) for row in await conn.execute(query)]
        finally:
            await engine.dispose()

    async def children() -> dict[str, int]:
        engine = create_engine(db_url)
        try:
            async with engine.connect() as conn:
                return {
                    table: await conn.scalar(sa.text(f"SELECT count(*) FROM {table}"))
                    for table in CHILDREN
                }
        finally:
            await engine.dispose()

    kept, rows = await sums(), await children()
    assert len(kept) > 60 and rows["usage"] == rows["tags"] == 60
    await downgrade(db_url, "0009")  # on SQLite it builds `exchanges` anew: children stay
    assert await children() == rows
    await upgrade(db_url)
    assert await sums() == kept
