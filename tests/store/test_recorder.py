"""The database recorder under real failures: a PostgreSQL outage and a stall through a TCP relay
the test cuts or stalls, a locked SQLite file, a full queue, a corrupt journal, a shutdown with
the database down."""

from __future__ import annotations

import asyncio
import gzip
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from proxy.config import Config
from proxy.exchange import Exchange
from proxy.relay.headers import key_identity
from proxy.store import StoreError, create_engine, upgrade
from proxy.store.backlog import BUILT_FROM
from proxy.store.lines import decode, encode
from proxy.store.recorder import DatabaseRecorder, open_recorder
from tests import dbs
from tests.conftest import until as wait_until
from tests.dbs import chat_exchange, sqlite_url
from tests.tcprelay import TcpRelay

db_url = dbs.db_url  # fixture
pg_url = dbs.pg_url  # fixture

TOKENS = ["Hé", "llo", " 世界"]


def test_a_journal_line_round_trips_what_the_database_would_store() -> None:
    ex = chat_exchange(
        stream=True,
        tags={"team": "a"},
        raw_stream_gz=gzip.compress(b"data: {}\n\n\xff"),
        raw_pacing=[(3, 0.5)],
        parse_errors=["bad line"],
    )
    ex.request_json = None  # a body that is not JSON travels as bytes
    ex.request_body = b"\x00\x01 not json"
    back = decode(encode(ex))
    assert back == replace(ex, response_body=None)  # the JSON response stands for the body
    omitted = decode(encode(replace(ex, omit_request=True, omit_response=True)))
    assert omitted.request_body is omitted.response_json is omitted.raw_stream_gz is None
    assert omitted.usage == ex.usage


def config(url: str, tmp_path: Path, **overrides: object) -> Config:
    values: dict[str, object] = {
        "db_url": url,
        "spool_path": str(tmp_path / "records.spool"),
        "batch_interval": 0.01,
        "shutdown_grace": 10.0,
    }
    return replace(Config(), **{**values, **overrides})  # type: ignore[arg-type]


async def started(cfg: Config, **engine_options: Any) -> DatabaseRecorder:
    recorder = DatabaseRecorder(cfg, **engine_options)
    recorder.retry_min, recorder.retry_max = 0.05, 0.3
    await recorder.start()
    return recorder


async def query(url: str, sql: str) -> list[tuple[Any, ...]]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return [tuple(row) for row in await conn.execute(sa.text(sql))]
    finally:
        await engine.dispose()


async def assert_stored_once(url: str, exchanges: list[Exchange], tokens: int = 0) -> None:
    """Every exchange is in the database exactly once, children and counts included."""
    ids = await query(url, "SELECT id, count(*) FROM exchanges GROUP BY id")
    assert sorted(ids) == sorted((ex.id, 1) for ex in exchanges)
    assert await query(url, "SELECT count(*) FROM usage") == [(len(exchanges),)]
    assert await query(url, "SELECT count(*) FROM choices") == [(len(exchanges),)]
    assert await query(url, "SELECT count(*) FROM logprobs") == [(len(exchanges) * tokens,)]
    assert await query(url, "SELECT sum(count) FROM fingerprints") == [(len(exchanges),)]


def spool_files(tmp_path: Path) -> list[str]:
    """Journal files holding records (the progress file `.done` aside)."""
    return sorted(
        p.name
        for p in tmp_path.glob("records.spool*")
        if p.stat().st_size and not p.name.endswith(".done")
    )


def uncommitted(recorder: DatabaseRecorder) -> bool:
    """Whether the journal holds records the database does not have yet."""
    return recorder.journal.done < recorder.journal.end


def journal_lines(tmp_path: Path) -> list[bytes]:
    """The records in the journal's live segment, as lines."""
    return (tmp_path / "records.spool").read_bytes().splitlines()


@pytest.fixture
async def sqlite_db(tmp_path: Path) -> AsyncIterator[str]:
    url = sqlite_url(tmp_path / "flightrec.db")
    await upgrade(url)
    yield url


class SqliteLock:
    """Another process-like writer holding the SQLite file exclusively: writes get SQLITE_BUSY."""

    def __init__(self, url: str) -> None:
        database = make_url(url).database
        assert database is not None
        self.conn = sqlite3.connect(database, isolation_level=None)

    def __enter__(self) -> SqliteLock:
        self.conn.execute("BEGIN EXCLUSIVE")
        return self

    def __exit__(self, *_: object) -> None:
        self.conn.execute("COMMIT")
        self.conn.close()


async def test_every_record_reaches_the_database(db_url: str, tmp_path: Path) -> None:
    await upgrade(db_url)
    recorder = await started(config(db_url, tmp_path, batch_size=100))
    exchanges = [chat_exchange(logprobs=TOKENS) for _ in range(1000)]
    for ex in exchanges:
        recorder.accept(ex)
    assert recorder.readiness() is None
    await recorder.stop()
    await assert_stored_once(db_url, exchanges, tokens=len(TOKENS))
    assert spool_files(tmp_path) == []


async def test_long_records_reach_the_database_from_the_rows_built_as_they_were_journaled(
    db_url: str, tmp_path: Path
) -> None:
    """Records with long lines wait as their line and rows (`backlog.Built`), among records
    that wait as themselves: every one is written once, logprobs in their order."""
    await upgrade(db_url)
    recorder = await started(config(db_url, tmp_path, batch_size=50))
    tokens = [f" tok{i}" for i in range(300)]
    exchanges = [chat_exchange(logprobs=tokens if i % 3 else TOKENS) for i in range(300)]
    assert len(encode(exchanges[1])) >= BUILT_FROM > len(encode(exchanges[0]))
    for i, ex in enumerate(exchanges):
        recorder.accept(ex)
        if i % 40 == 39:
            await asyncio.sleep(0)  # journaled a turn's worth at a time, as a server does
    await asyncio.sleep(0)
    # What is stored is what was journaled: the long records' rows were built with their
    # lines, so a change to the exchange since does not reach the database.
    exchanges[1].response_json["choices"][0]["logprobs"]["content"][0]["token"] = "changed"
    await recorder.stop()
    ids = await query(db_url, "SELECT id, count(*) FROM exchanges GROUP BY id")
    assert sorted(ids) == sorted((ex.id, 1) for ex in exchanges)
    counts = await query(db_url, "SELECT exchange_id, count(*) FROM logprobs GROUP BY exchange_id")
    assert dict(counts) == {ex.id: 300 if i % 3 else len(TOKENS) for i, ex in enumerate(exchanges)}
    stored = await query(
        db_url,
        f"SELECT token FROM logprobs WHERE exchange_id = '{exchanges[1].id}' ORDER BY position",
    )
    assert [token for (token,) in stored] == tokens
    assert spool_files(tmp_path) == []


async def test_a_record_without_a_journal_line_is_written_or_counted_lost_never_a_failure(
    sqlite_db: str, tmp_path: Path
) -> None:
    """A record that cannot be encoded (tags that hold themselves) waits in memory only: it
    is written when the database is there; at shutdown without one it is counted lost, and
    the records journaled with it are kept for the next start."""
    tags: dict[str, Any] = {}
    tags["self"] = tags
    recorder = await started(config(sqlite_db, tmp_path))
    odd, fine = chat_exchange(tags=tags), chat_exchange()
    for ex in (odd, fine):
        recorder.accept(ex)
    await recorder.stop()
    await assert_stored_once(sqlite_db, [odd, fine])
    assert recorder.losses.in_memory_total == 1 and recorder.losses.lost_total == 0

    with SqliteLock(sqlite_db):  # no database this time: both are left at shutdown
        recorder = await started(config(sqlite_db, tmp_path, shutdown_grace=0.5))
        late, other = chat_exchange(tags=tags), chat_exchange()
        for ex in (late, other):
            recorder.accept(ex)
        await recorder.stop()
    assert recorder.losses.lost_total == 1
    assert [decode(line).id for line in journal_lines(tmp_path)] == [other.id]


async def test_postgres_outage_mid_traffic_spills_and_recovers(pg_url: str, tmp_path: Path) -> None:
    await upgrade(pg_url)
    target = make_url(pg_url)
    relay = TcpRelay()
    port = relay.start(target.host or "127.0.0.1", target.port or 5432)
    relayed = target.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
    recorder = await started(config(relayed, tmp_path, batch_size=50))
    sent: list[Exchange] = []

    async def traffic() -> None:
        for _ in range(1500):
            ex = chat_exchange(logprobs=TOKENS)
            recorder.accept(ex)
            sent.append(ex)
            await asyncio.sleep(0.002)

    running = asyncio.create_task(traffic())
    await asyncio.sleep(0.5)
    await asyncio.to_thread(relay.cut)
    await wait_until(lambda: recorder.readiness() is not None)
    assert (recorder.readiness() or "").startswith("database unavailable")
    assert not recorder.database_up()
    await wait_until(lambda: uncommitted(recorder))
    await asyncio.to_thread(relay.resume)
    await wait_until(lambda: recorder.readiness() is None)
    assert recorder.database_up()
    await running
    await recorder.stop()
    relay.close()
    await assert_stored_once(pg_url, sent, tokens=len(TOKENS))
    assert spool_files(tmp_path) == []


async def test_without_auto_upgrade_a_database_down_at_start_waits_for_its_schema(
    pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Down at start, `serve`'s recorder starts unready; once PostgreSQL answers, it checks the
    schema and, until someone upgrades it, keeps what it was given and says why."""
    target = make_url(pg_url)
    relay = TcpRelay()
    port = relay.start(target.host or "127.0.0.1", target.port or 5432)
    relayed = target.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
    try:
        await asyncio.to_thread(relay.cut)
        cfg = config(relayed, tmp_path, auto_upgrade=False)
        with pytest.raises(StoreError, match="cannot connect"):
            await open_recorder(cfg)  # not for `serve`: it must not wait
        recorder = await open_recorder(cfg, wait_for_database=True)
        try:
            recorder.retry_min, recorder.retry_max = 0.05, 0.3
            assert "cannot connect" in (recorder.readiness() or "")
            assert not recorder.database_up()
            sent = [chat_exchange() for _ in range(3)]
            for ex in sent:
                recorder.accept(ex)
            await asyncio.to_thread(relay.resume)

            def says_upgrade() -> bool:
                return "flightrec db upgrade" in (recorder.readiness() or "")

            await wait_until(says_upgrade, within=10)
            assert "database not ready" in caplog.text and "db upgrade" in caplog.text
            await upgrade(pg_url)
            await wait_until(lambda: recorder.readiness() is None, within=10)
            await wait_until(lambda: not uncommitted(recorder), within=10)
        finally:
            await recorder.stop()
    finally:
        relay.close()
    await assert_stored_once(pg_url, sent)


async def test_a_postgresql_stall_is_logged_once_and_so_is_its_end(
    pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await upgrade(pg_url)
    target = make_url(pg_url)
    relay = TcpRelay()
    port = relay.start(target.host or "127.0.0.1", target.port or 5432)
    relayed = target.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)
    recorder = await started(config(relayed, tmp_path))
    sent = [chat_exchange() for _ in range(3)]

    def said(level: int, text: str) -> int:
        return sum(r.levelno == level and text in r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.INFO, logger="proxy.store.recorder"):
        recorder.accept(sent[0])
        await wait_until(lambda: recorder.readiness() is None and not uncommitted(recorder))
        await asyncio.to_thread(relay.stall)
        recorder.accept(sent[1])
        await wait_until(lambda: (recorder.readiness() or "").startswith("database stalled"))
        await wait_until(lambda: said(logging.WARNING, "database stalled") == 1, within=2)
        await asyncio.to_thread(relay.resume)
        recorder.accept(sent[2])
        await wait_until(lambda: recorder.readiness() is None, within=30)
        await wait_until(lambda: said(logging.INFO, "again") == 1)  # the stall's or the outage's
    await recorder.stop()
    relay.close()
    assert said(logging.WARNING, "database stalled") == 1
    await assert_stored_once(pg_url, sent, tokens=0)


async def test_locked_sqlite_spills_and_recovers(sqlite_db: str, tmp_path: Path) -> None:
    recorder = await started(config(sqlite_db, tmp_path, batch_size=20), busy_timeout_ms=20)
    sent = [chat_exchange(logprobs=TOKENS) for _ in range(300)]
    with SqliteLock(sqlite_db):
        for ex in sent[:200]:
            recorder.accept(ex)
            await asyncio.sleep(0.001)
        await wait_until(lambda: recorder.readiness() is not None)
        await wait_until(lambda: uncommitted(recorder))
    for ex in sent[200:]:
        recorder.accept(ex)
    await wait_until(lambda: recorder.readiness() is None)
    await recorder.stop()
    await assert_stored_once(sqlite_db, sent, tokens=len(TOKENS))
    assert spool_files(tmp_path) == []


async def test_past_queue_size_the_writer_reads_the_journal(sqlite_db: str, tmp_path: Path) -> None:
    recorder = await started(config(sqlite_db, tmp_path, queue_size=10, batch_size=7))
    sent = [chat_exchange() for _ in range(200)]
    for ex in sent:  # no await in between: the writer cannot drain the queue meanwhile
        recorder.accept(ex)
    await asyncio.sleep(0.05)
    assert sorted(journal_lines(tmp_path)) == sorted(encode(ex).rstrip(b"\n") for ex in sent)
    await recorder.stop()
    await assert_stored_once(sqlite_db, sent)
    assert spool_files(tmp_path) == []


async def test_shutdown_with_the_database_down_keeps_everything_for_next_start(
    sqlite_db: str, tmp_path: Path
) -> None:
    cfg = config(sqlite_db, tmp_path, shutdown_grace=1.0)
    sent = [chat_exchange() for _ in range(50)]
    with SqliteLock(sqlite_db):
        recorder = await started(cfg, busy_timeout_ms=20)
        for ex in sent:
            recorder.accept(ex)
        started_closing = time.monotonic()
        await recorder.stop()
        assert time.monotonic() - started_closing < 10  # gave up after shutdown_grace
        assert sorted(journal_lines(tmp_path)) == sorted(encode(ex).rstrip(b"\n") for ex in sent)

    again = await started(cfg)  # the next start writes what the journal holds
    await again.stop()
    await assert_stored_once(sqlite_db, sent)
    assert spool_files(tmp_path) == []


async def test_a_record_is_never_written_twice(db_url: str, tmp_path: Path) -> None:
    await upgrade(db_url)
    cfg = config(db_url, tmp_path)
    sent = [chat_exchange(logprobs=TOKENS) for _ in range(5)]
    # Already in the journal *and* recorded again: read again after an unknown commit outcome.
    (tmp_path / "records.spool").write_bytes(b"".join(encode(ex) for ex in sent))
    recorder = await started(cfg)
    for ex in sent + sent:
        recorder.accept(ex)
    await recorder.stop()
    assert (recorder.written, recorder.database_up()) == (5, True)
    again = await started(cfg)
    for ex in sent:
        again.accept(ex)
    await again.stop()
    assert again.written == 0  # all found stored
    await assert_stored_once(db_url, sent, tokens=len(TOKENS))
    # Skipped as stored, not refused by the database and set aside.
    assert not (tmp_path / "records.spool.bad").exists()


async def test_corrupt_spool_lines_are_set_aside(
    sqlite_db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = [chat_exchange() for _ in range(3)]
    cut = encode(chat_exchange())[:-40]  # a crash in the middle of an append
    (tmp_path / "records.spool").write_bytes(
        encode(good[0])
        + b"not json at all\n"
        + b'{"v": 1, "exchange": {"id": 1}}\n'
        + encode(good[1])
        + cut
    )
    recorder = await started(config(sqlite_db, tmp_path))
    recorder.accept(good[2])  # lands after the cut line, not glued to it
    with caplog.at_level(logging.WARNING, logger="proxy.store.journal"):
        await recorder.stop()
    await assert_stored_once(sqlite_db, good)
    bad = (tmp_path / "records.spool.bad").read_bytes().splitlines()
    assert bad == [b"not json at all", b'{"v": 1, "exchange": {"id": 1}}', cut]
    assert sum("not a record" in r.getMessage() for r in caplog.records) == 3
    assert spool_files(tmp_path) == ["records.spool.bad"]


def _poisoned(where: str, logprobs: list[str] | None) -> Exchange:
    """A record with a value no database takes (a lone surrogate) in its exchange row, the
    first table a batch writes, or in a choice row, written after the exchange rows."""
    if where == "exchange":
        return chat_exchange(user="bad \ud800 surrogate", logprobs=logprobs)
    ex = chat_exchange(logprobs=logprobs)  # the body as received stays valid; the choice not
    ex.response_json["choices"][0]["message"]["content"] = "bad \ud800 surrogate"
    return ex


@pytest.mark.parametrize("where", ["exchange", "choice"])
@pytest.mark.parametrize("length", ["short", "long"])
async def test_a_record_the_database_refuses_does_not_block_the_rest(
    db_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str, length: str
) -> None:
    """Also a record waiting as its line and rows (`backlog.Built`): its line is set aside."""
    await upgrade(db_url)
    recorder = await started(config(db_url, tmp_path, batch_interval=0.2))
    poisoned = _poisoned(where, [f"t{i}" for i in range(300)] if length == "long" else None)
    assert (len(encode(poisoned)) >= BUILT_FROM) == (length == "long")
    fine = [chat_exchange(), chat_exchange()]
    for ex in (fine[0], poisoned, fine[1]):  # one batch
        recorder.accept(ex)
    with caplog.at_level(logging.WARNING):
        await recorder.stop()
    await assert_stored_once(db_url, fine)
    (bad,) = (tmp_path / "records.spool.bad").read_bytes().splitlines(keepends=True)
    assert bad == encode(poisoned)
    assert any(poisoned.id in r.getMessage() for r in caplog.records)


async def test_api_key_never_reaches_database_or_journal(sqlite_db: str, tmp_path: Path) -> None:
    key = "sk-proj-" + "Zq81" * 12
    key_hash, key_hint = key_identity({"Authorization": f"Bearer {key}"})
    assert key_hash and key_hint
    sent = [chat_exchange(key_hash=key_hash, key_hint=key_hint) for _ in range(40)]
    recorder = await started(config(sqlite_db, tmp_path, queue_size=5), busy_timeout_ms=20)
    with SqliteLock(sqlite_db):
        for ex in sent:
            recorder.accept(ex)
        await asyncio.sleep(0.2)
        spool = (tmp_path / "records.spool").read_bytes()
        assert key_hash.encode() in spool  # the journal does hold these records...
        assert key.encode() not in spool  # ...but never the key
        assert key[-12:].encode() not in spool
    await recorder.stop()
    await assert_stored_once(sqlite_db, sent)
    for path in os.listdir(tmp_path):  # database, WAL, journal and .bad alike
        assert key.encode() not in (tmp_path / path).read_bytes(), path
    assert await query(sqlite_db, "SELECT DISTINCT key_hash, key_hint FROM exchanges") == [
        (key_hash, key_hint)
    ]


async def test_open_recorder_upgrades_checks_and_starts(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "new.db")
    with pytest.raises(StoreError, match="run `flightrec db upgrade`"):
        await open_recorder(config(url, tmp_path, auto_upgrade=False))
    recorder = await open_recorder(config(url, tmp_path))
    await recorder.start()  # the app's cleanup context starts it again: harmless
    with pytest.raises(StoreError, match="in use by another flightrec process"):
        await open_recorder(config(url, tmp_path))
    ex = chat_exchange()
    recorder.accept(ex)
    await recorder.stop()
    await assert_stored_once(url, [ex])
    with pytest.raises(StoreError, match="cannot connect to the database"):
        await open_recorder(config("postgresql+asyncpg://x@127.0.0.1:9/none", tmp_path))
