"""The writer takes and builds the next batch while the database works on one: real SQLite and
PostgreSQL databases held up by another connection's lock, a journal that refuses records so
that memory is the only place they are, an outage and a shutdown in between."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
from sqlalchemy.engine import make_url

from proxy.config import Config
from proxy.store import upgrade
from tests import dbs
from tests.conftest import until as wait_until
from tests.dbs import chat_exchange
from tests.store import test_recorder
from tests.store.test_recorder import SqliteLock, assert_stored_once, config, spool_files, started

db_url = dbs.db_url  # fixture
sqlite_db = test_recorder.sqlite_db  # fixture


@asynccontextmanager
async def writes_wait(url: str) -> AsyncIterator[None]:
    """Another connection holds the database: the writer's transaction waits for it."""
    if url.startswith("sqlite"):
        with SqliteLock(url):
            yield
        return
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("LOCK TABLE exchanges IN ACCESS EXCLUSIVE MODE")
            yield
    finally:
        await conn.close()


async def test_the_next_batch_is_taken_and_built_while_one_is_in_the_database(
    db_url: str, tmp_path: Path
) -> None:
    await upgrade(db_url)
    sent = [chat_exchange() for _ in range(30)]
    async with writes_wait(db_url):
        recorder = await started(config(db_url, tmp_path, batch_size=10), busy_timeout_ms=10_000)
        for ex in sent:
            recorder.accept(ex)
        if db_url.startswith("sqlite"):
            # No batch is taken ahead: SQLite's work is the process's own (`Batches.overlap`).
            await wait_until(lambda: recorder.queue_depth() == 20)
            await asyncio.sleep(0.2)
            assert recorder.queue_depth() == 20 and recorder._batches.ahead is None
        else:
            # The first batch waits in the database; the second is taken and built behind it.
            await wait_until(lambda: recorder.queue_depth() == 10)
            await wait_until(
                lambda: (ahead := recorder._batches.ahead) is not None and ahead.rows is not None
            )
            await asyncio.sleep(0.2)
            assert recorder.queue_depth() == 10  # one batch ahead, not more
        assert recorder.journal.done == (1, 0)  # neither is committed while neither is stored
        assert recorder.written == 0
    await recorder.stop()
    assert recorder.written == len(sent)
    await assert_stored_once(db_url, sent)
    assert spool_files(tmp_path) == []


def refusing(cfg: Config) -> Config:
    """`cfg` with a journal too small for any record: records are kept in memory only."""
    return replace(cfg, journal_max_bytes=1)


async def test_an_outage_keeps_the_batch_and_the_one_built_behind_it(
    sqlite_db: str, tmp_path: Path
) -> None:
    sent = [chat_exchange() for _ in range(30)]
    with SqliteLock(sqlite_db):
        recorder = await started(
            refusing(config(sqlite_db, tmp_path, batch_size=10)), busy_timeout_ms=20
        )
        recorder._batches.overlap = True  # what PostgreSQL does; SQLite can be made to fail
        for ex in sent:
            recorder.accept(ex)
        await wait_until(lambda: not recorder.database_up() and recorder.queue_depth() == 10)
        await asyncio.sleep(0.5)  # a few tries, each failing
    await wait_until(lambda: recorder.written == len(sent))
    await recorder.stop()
    await assert_stored_once(sqlite_db, sent)
    assert recorder.losses.lost_total == 0


async def test_shutdown_with_the_database_down_journals_both_batches_held_in_memory(
    sqlite_db: str, tmp_path: Path
) -> None:
    cfg = config(sqlite_db, tmp_path, batch_size=10, shutdown_grace=1.0)
    sent = [chat_exchange() for _ in range(30)]
    with SqliteLock(sqlite_db):
        recorder = await started(refusing(cfg), busy_timeout_ms=20)
        recorder._batches.overlap = True  # what PostgreSQL does; SQLite can be made to fail
        for ex in sent:
            recorder.accept(ex)
        await wait_until(lambda: not recorder.database_up() and recorder.queue_depth() == 10)
        await recorder.stop()
    again = await started(cfg)  # the next start writes what the journal got at shutdown
    await again.stop()
    await assert_stored_once(sqlite_db, sent)
    assert recorder.losses.lost_total == 0
