"""The SQLite writer works on the event loop's thread without holding it: it waits for another
writer's lock with asyncio sleeps, gives the relay turns during a big batch, and checkpoints the WAL
on a worker thread."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import os
import sqlite3
import stat
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from proxy.exchange import Exchange
from proxy.store import records, sqlite_writer, upgrade, wal
from proxy.store.engine import SQLITE_PAGE_SIZE, StoreError, create_engine
from proxy.store.records import table_records
from proxy.store.rows import rows_for
from proxy.store.sqlite_writer import SqliteWriter, sqlite_null
from proxy.store.turns import Turns
from proxy.store.writer import writer_for
from tests.dbs import chat_exchange, sqlite_url
from tests.store.test_recorder import assert_stored_once, config, spool_files, started


@pytest.fixture
async def db_path(tmp_path: Path) -> Path:
    path = tmp_path / "flightrec.db"
    await upgrade(sqlite_url(path))
    return path


def file_size(path: Path) -> int:
    return path.stat().st_size


def page_size_and_mode(path: Path) -> tuple[int, str]:
    with contextlib.closing(sqlite3.connect(path)) as con:
        return (
            con.execute("PRAGMA page_size").fetchone()[0],
            con.execute("PRAGMA journal_mode").fetchone()[0],
        )


async def test_a_new_database_has_16_kib_pages_in_wal_mode(db_path: Path) -> None:
    assert page_size_and_mode(db_path) == (SQLITE_PAGE_SIZE, "wal")
    assert SQLITE_PAGE_SIZE == 16_384


async def test_the_writer_opening_an_empty_file_gives_it_16_kib_pages(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"  # the recorder normally finds a migrated database
    writer = SqliteWriter(str(path), 1000)
    try:
        writer._connection()
    finally:
        await writer.close()
    assert page_size_and_mode(path) == (SQLITE_PAGE_SIZE, "wal")


async def test_an_existing_database_keeps_its_page_size_and_is_written(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with contextlib.closing(sqlite3.connect(path)) as con:
        con.execute("PRAGMA page_size = 4096")
        con.execute("CREATE TABLE before_us (x)")  # the file now has its pages
    await upgrade(sqlite_url(path))
    writer = SqliteWriter(str(path), 1000)
    try:
        assert await writer.write([rows_for(chat_exchange())]) == 1
    finally:
        await writer.close()
    assert page_size_and_mode(path) == (4096, "wal")
    with contextlib.closing(sqlite3.connect(path)) as con:
        assert con.execute("SELECT count(*) FROM exchanges").fetchone()[0] == 1


def test_sqlite_stores_the_fast_null_as_null() -> None:
    # The writer binds NaN for None (cheaper in Python 3.11's sqlite3); if this SQLite stored it
    # as anything but NULL the fast path would be off and None bound instead.
    null = sqlite_null()
    assert null is not None and math.isnan(null)


async def test_none_is_stored_as_null_and_booleans_as_integers(db_path: Path) -> None:
    ex = chat_exchange(fingerprint=None)
    ex.response_json["choices"][0]["message"]["content"] = None  # a tool-call-only answer
    rows = rows_for(ex)
    writer = SqliteWriter(str(db_path), busy_timeout_ms=1000)
    try:
        assert await writer.write([rows]) == 1
    finally:
        await writer.close()
    sent = dict(table_records([rows]))
    assert len(sent) == 4  # exchanges, completions, choices, usage
    with contextlib.closing(sqlite3.connect(db_path)) as con:
        for table, found in sent.items():
            names = [c.name for c in table.columns]
            types = con.execute(
                f"SELECT {', '.join(f'typeof({n})' for n in names)} FROM {table.name}"
            ).fetchone()
            for name, value, stored in zip(names, found[0], types, strict=True):
                if value is None:
                    assert stored == "null", f"{table.name}.{name}"
                elif isinstance(value, bool):
                    assert stored == "integer", f"{table.name}.{name}"
        flags = "stream, request_omitted, response_omitted"
        assert con.execute(f"SELECT {flags} FROM exchanges").fetchone() == (0, 0, 0)


class Ticker:
    """Counts turns of the event loop while it runs, and the longest wait for one."""

    def __init__(self) -> None:
        self.turns = 0
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while True:
            await asyncio.sleep(0)
            self.turns += 1
            now = loop.time()
            self.longest = max(self.longest, now - last)
            last = now

    def __enter__(self) -> Ticker:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def test_the_writer_skips_key_checks_its_batches_cannot_fail(db_path: Path) -> None:
    """Children go in only with their exchange, so the writer's connection does not look each
    child row's exchange up: what it writes passes `foreign_key_check`, and other connections
    still check keys and cascade deletes."""
    writer = SqliteWriter(str(db_path), 1000)
    exchanges = [chat_exchange(logprobs=["a", "b"], tags={"team": "x"}) for _ in range(3)]
    try:
        assert await writer.write([rows_for(ex) for ex in exchanges]) == 3
        assert writer._connection().execute("PRAGMA foreign_keys").fetchone()[0] == 0
    finally:
        await writer.close()
    with contextlib.closing(sqlite3.connect(db_path, isolation_level=None)) as con:
        assert con.execute("PRAGMA foreign_key_check").fetchall() == []
        assert con.execute("SELECT count(*) FROM logprobs").fetchone()[0] == 6
        con.execute("PRAGMA foreign_keys = ON")
        with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
            con.execute("INSERT INTO tags VALUES ('no-such-exchange', 'k', 'v')")
        con.execute("DELETE FROM exchanges WHERE id = ?", (exchanges[0].id,))
        left = "SELECT count(*) FROM {} WHERE exchange_id = ?"
        for table in ("logprobs", "tags", "choices", "usage"):
            assert con.execute(left.format(table), (exchanges[0].id,)).fetchone()[0] == 0
        assert con.execute("SELECT count(*) FROM logprobs").fetchone()[0] == 4


_WRITER_STATEMENTS = ("INSERT OR FAIL", "SELECT id FROM", "SELECT turn_key")


def prepared(con: sqlite3.Connection) -> set[str]:
    """The writer's statements its connection holds prepared (SQLite's `sqlite_stmt`)."""
    found = con.execute("SELECT sql FROM sqlite_stmt").fetchall()
    return {sql for (sql,) in found if sql.startswith(_WRITER_STATEMENTS)}


async def test_batches_of_any_size_reuse_the_statements_they_prepared(db_path: Path) -> None:
    """Preparing a multi-row INSERT costs several times running it (docs/performance.md), so a
    batch of a size not seen before must not need a statement text of its own: after batches
    of 1 to 70 exchanges, batches of 77 and 121 prepare nothing new, and every table's INSERTs
    and the id lookups are a handful of texts, not one per size."""
    writer = SqliteWriter(str(db_path), 1000)
    con = writer._connection()
    try:
        prepared(con)
    except sqlite3.OperationalError as exc:
        await writer.close()
        pytest.skip(f"this SQLite has no sqlite_stmt table to list prepared statements: {exc}")
    try:
        for size in range(1, 71):
            batch = [chat_exchange(tags={"team": "x"}, user="u") for _ in range(size)]
            assert await writer.write([rows_for(ex) for ex in batch]) == size
        seen = prepared(con)
        for size in (77, 121):
            batch = [chat_exchange(tags={"team": "x"}, user="u") for _ in range(size)]
            assert await writer.write([rows_for(ex) for ex in batch]) == size
            assert prepared(con) == seen
    finally:
        await writer.close()
    inserts = [sql.split('"')[1] for sql in seen if sql.startswith("INSERT")]
    assert set(inserts) >= {"exchanges", "choices", "usage", "tags"}
    for table in set(inserts):
        assert inserts.count(table) <= 7, table  # 64 rows, or 32, 16, ... 1
    assert sum(sql.startswith("SELECT id FROM") for sql in seen) <= 8  # 1 to 128 ids
    with contextlib.closing(sqlite3.connect(db_path)) as check:
        assert check.execute("SELECT count(*) FROM exchanges").fetchone()[0] == 2683
        assert check.execute("SELECT count(*) FROM tags").fetchone()[0] == 2683


def test_spans_cut_rows_into_inserts_of_few_lengths() -> None:
    lengths: set[int] = set()
    for count in range(300):
        spans = list(sqlite_writer.spans(count, 64))
        bounds = [0, *(stop for _, stop in spans)]
        assert spans == list(itertools.pairwise(bounds)) and bounds[-1] == count
        cut = [stop - start for start, stop in spans]
        assert cut == sorted(cut, reverse=True)
        lengths.update(cut)
    assert lengths == {1, 2, 4, 8, 16, 32, 64}


def test_in_lists_pad_lookups_to_a_power_of_two_with_a_value_already_asked() -> None:
    most = records.MAX_IN_LIST
    for count in (1, 2, 3, 100, 512, 513, 1100):
        values = [f"id{i}" for i in range(count)]
        parts = list(records.in_lists(values))
        assert len(parts) == math.ceil(count / most)
        for at, (marks, part) in enumerate(parts):
            chunk = values[at * most : (at + 1) * most]
            assert part[: len(chunk)] == chunk and set(part) == set(chunk)
            assert marks.count("?") == len(part) <= most
            assert len(part) & (len(part) - 1) == 0
    assert list(records.in_lists([])) == []


async def test_a_row_refused_halfway_through_an_insert_leaves_nothing_of_its_batch(
    db_path: Path,
) -> None:
    """The multi-row INSERTs are `OR FAIL` (rows before the refused one are kept by the
    statement, so SQLite keeps no copy of the pages it changes to undo it): the writer's
    rollback of the whole transaction is what leaves nothing behind, and the connection
    writes the next batch."""
    writer = SqliteWriter(str(db_path), 1000)
    refused = [rows_for(chat_exchange(tags={"team": "x"})) for _ in range(3)]
    # The second exchange's choice twice: its key is refused in the middle of the INSERT,
    # after the first exchange's choice and all three exchanges' rows went in.
    refused[1].choices = [*refused[1].choices, *refused[1].choices]
    later = [chat_exchange() for _ in range(2)]
    try:
        with pytest.raises(sqlite3.IntegrityError, match="UNIQUE"):
            await writer.write(refused)
        assert await writer.write([rows_for(ex) for ex in later]) == 2
    finally:
        await writer.close()
    with contextlib.closing(sqlite3.connect(db_path)) as con:
        stored = {row[0] for row in con.execute("SELECT id FROM exchanges")}
        assert stored == {ex.id for ex in later}
        for table in ("tags", "choices", "completions", "usage"):
            left = con.execute(f"SELECT DISTINCT exchange_id FROM {table}").fetchall()
            assert {row[0] for row in left} <= stored, table


async def test_a_big_batch_gives_the_loop_turns_while_it_is_written(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A budget of no time: a turn is due before every chunk of rows, however fast the machine.
    monkeypatch.setattr(sqlite_writer, "Turns", lambda pace: Turns(lambda others: 0.0))
    ticker = Ticker()
    turns_at_chunk: list[int] = []
    insert = sqlite_writer._insert

    def watched(con: Any, table: Any, rows: Any) -> None:
        turns_at_chunk.append(ticker.turns)
        insert(con, table, rows)

    monkeypatch.setattr(sqlite_writer, "_insert", watched)
    writer = SqliteWriter(str(db_path), busy_timeout_ms=1000)
    batch = [rows_for(chat_exchange(logprobs=["a", "b", "c"])) for _ in range(300)]
    try:
        with ticker:
            assert await writer.write(batch) == 300
        # The loop turned before each chunk (300 exchange rows alone are 19 chunks); written
        # in one go it would not turn until the COMMIT.
        assert len(turns_at_chunk) >= 300 // sqlite_writer.FAT_CHUNK_ROWS["exchanges"]
        assert all(a < b for a, b in itertools.pairwise(turns_at_chunk))
        assert await writer.write(batch) == 0  # idempotent by exchange id
    finally:
        await writer.close()
    with contextlib.closing(sqlite3.connect(db_path)) as con:
        assert con.execute("SELECT count(*) FROM logprobs").fetchone() == (900,)
        assert con.execute("SELECT sum(count) FROM fingerprints").fetchone() == (300,)


async def test_another_writer_s_lock_is_waited_for_without_holding_the_loop(
    db_path: Path, tmp_path: Path
) -> None:
    url = sqlite_url(db_path)
    recorder = await started(config(url, tmp_path), busy_timeout_ms=10_000)
    other = sqlite3.connect(db_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    sent = [chat_exchange() for _ in range(3)]
    with Ticker() as ticker:
        for ex in sent:
            recorder.accept(ex)
        await asyncio.sleep(0.5)  # the writer is waiting for the lock all this while
    other.execute("COMMIT")
    other.close()
    await recorder.stop()
    # A writer blocked in SQLite's own busy wait would have held the loop for the whole
    # busy timeout (10 s) and only then spooled.
    assert ticker.longest < 5.0
    await assert_stored_once(url, sent)
    assert spool_files(tmp_path) == []  # waited, not spooled


async def test_the_wal_is_checkpointed_by_the_writer(db_path: Path) -> None:
    # A reader stays connected, so closing the writer's connection does not checkpoint (only
    # the last connection does), and the writer's own connection never auto-checkpoints.
    reader = sqlite3.connect(db_path)
    reader.execute("SELECT count(*) FROM exchanges").fetchone()
    empty = file_size(db_path)
    writer = SqliteWriter(str(db_path), busy_timeout_ms=1000)
    await writer.write([rows_for(chat_exchange(logprobs=["x"] * 50)) for _ in range(50)])
    await writer.close()  # waits for the checkpoint it started
    assert file_size(db_path) > empty
    reader.close()


async def test_a_writer_always_busy_keeps_its_log_from_growing_without_end(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches back to back, a checkpoint due after every one: a checkpoint beside the writes
    never copies the whole log, so the log could never start again and grew by each batch.
    Once it is past `WAL_CATCH_UP_BYTES` the writer checkpoints between two batches, the log
    starts again and is cut back to `WAL_LIMIT_BYTES`."""
    catch_up = 1024 * 1024  # a batch below writes ~0.5 MB of log
    monkeypatch.setattr(sqlite_writer, "WAL_LIMIT_BYTES", catch_up // 2)
    monkeypatch.setattr(sqlite_writer, "WAL_CATCH_UP_BYTES", catch_up)
    monkeypatch.setattr(sqlite_writer, "CHECKPOINT_EVERY", 0.0)
    writer = SqliteWriter(str(db_path), busy_timeout_ms=1000)
    wal = Path(f"{db_path}-wal")
    sizes = []
    try:
        for _ in range(60):
            await writer.write([rows_for(ex) for ex in logprob_batch()])
            sizes.append(file_size(wal))
    finally:
        await writer.close()
    # Without the checkpoints between batches: ~30 MB, and growing.
    assert max(sizes[-20:]) <= catch_up + 2 * max(sizes[0], 1), sizes


def logprob_batch() -> list[Exchange]:
    return [chat_exchange(logprobs=["token"] * 40) for _ in range(10)]


async def test_a_log_a_reader_holds_is_not_checkpointed_after_every_batch(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint between batches cannot copy a log a reader holds: past the size, the
    writer tries once, then keeps to one checkpoint every `CHECKPOINT_EVERY` while it lasts,
    and waits on none."""
    monkeypatch.setattr(sqlite_writer, "WAL_LIMIT_BYTES", 128 * 1024)
    monkeypatch.setattr(sqlite_writer, "WAL_CATCH_UP_BYTES", 256 * 1024)
    monkeypatch.setattr(sqlite_writer, "CHECKPOINT_EVERY", 0.25)
    ran: list[str] = []

    def counted(path: str) -> bool:
        ran.append(path)
        return wal.checkpoint(path)

    monkeypatch.setattr(sqlite_writer, "checkpoint", counted)
    reader = sqlite3.connect(db_path, isolation_level=None)
    writer = SqliteWriter(str(db_path), busy_timeout_ms=1000)
    try:
        await writer.write([rows_for(ex) for ex in logprob_batch()])
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM exchanges").fetchone()  # holds its snapshot
        started = time.monotonic()
        for _ in range(30):
            await writer.write([rows_for(ex) for ex in logprob_batch()])
        elapsed = time.monotonic() - started
        held = file_size(Path(f"{db_path}-wal"))
    finally:
        reader.close()
        await writer.close()
    assert held > 256 * 1024  # the reader kept the log from starting again
    # One a batch before: 31 here.
    assert len(ran) <= 2 + elapsed / 0.25 + 1, (len(ran), elapsed)


async def test_a_slow_checkpoint_between_batches_is_not_waited_for_long(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer waits `CATCH_UP_WAIT` at most (the recorder would call a longer write a
    stalled database); the checkpoint goes on and `close` waits for it."""
    monkeypatch.setattr(sqlite_writer, "WAL_LIMIT_BYTES", 128 * 1024)
    monkeypatch.setattr(sqlite_writer, "WAL_CATCH_UP_BYTES", 256 * 1024)
    monkeypatch.setattr(sqlite_writer, "CATCH_UP_WAIT", 0.1)
    done = []

    def slow(path: str) -> bool:
        time.sleep(1.0)
        done.append(wal.checkpoint(path))
        return done[-1]

    writer = SqliteWriter(str(db_path), busy_timeout_ms=1000)
    try:
        await writer.write([rows_for(ex) for ex in logprob_batch()])  # past the size
        monkeypatch.setattr(sqlite_writer, "checkpoint", slow)
        started = time.monotonic()
        await writer.write([rows_for(ex) for ex in logprob_batch()])
        assert time.monotonic() - started < 0.8
        assert done == []
    finally:
        await writer.close()
    assert done == [True]


async def test_an_error_other_than_busy_spools_and_reconnects(
    db_path: Path, tmp_path: Path
) -> None:
    url = sqlite_url(db_path)
    recorder = await started(config(url, tmp_path, batch_size=5))
    admin = sqlite3.connect(db_path, isolation_level=None)
    admin.execute("ALTER TABLE exchanges RENAME TO exchanges_away")  # "no such table"
    first = [chat_exchange() for _ in range(5)]
    for ex in first:
        recorder.accept(ex)
    deadline = asyncio.get_running_loop().time() + 10
    while not spool_files(tmp_path):
        assert asyncio.get_running_loop().time() < deadline, "nothing spooled"
        await asyncio.sleep(0.02)
    admin.execute("ALTER TABLE exchanges_away RENAME TO exchanges")
    admin.close()
    later = [chat_exchange() for _ in range(5)]
    for ex in later:
        recorder.accept(ex)
    await recorder.stop()
    await assert_stored_once(url, first + later)


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The common umask, under which files are created 0644 unless asked otherwise."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.usefixtures("umask_022")
async def test_the_database_and_its_wal_files_are_private(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    await upgrade(sqlite_url(path))  # what `serve` and `db upgrade` do first
    assert mode(path) == 0o600
    reader = sqlite3.connect(path)  # keeps -wal and -shm after the writer closes
    reader.execute("SELECT count(*) FROM exchanges").fetchone()
    writer = SqliteWriter(str(path), busy_timeout_ms=1000)
    await writer.write([rows_for(chat_exchange())])
    await writer.close()
    wal, shm = Path(f"{path}-wal"), Path(f"{path}-shm")
    assert file_size(wal) > 0
    assert (mode(path), mode(wal), mode(shm)) == (0o600, 0o600, 0o600)
    reader.close()

    fresh = tmp_path / "by-the-writer.db"  # a recorder may find no file at all
    writer = SqliteWriter(str(fresh), busy_timeout_ms=1000)
    writer._connection()
    await writer.close()
    assert mode(fresh) == 0o600

    kept = tmp_path / "kept.db"  # an existing file keeps the mode its owner gave it
    kept.touch(mode=0o640)
    await upgrade(sqlite_url(kept))
    assert mode(kept) == 0o640


async def test_a_sqlite_file_gets_the_loop_thread_writer_and_memory_an_error(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.db"
    engine = create_engine(sqlite_url(path))
    try:
        writer = writer_for(engine)
        assert isinstance(writer, SqliteWriter) and writer.path == str(path)
    finally:
        await engine.dispose()
    in_memory = create_engine("sqlite+aiosqlite://")
    try:
        with pytest.raises(StoreError, match="not a database in memory"):
            writer_for(in_memory)
    finally:
        await in_memory.dispose()


@pytest.mark.parametrize(
    "at",
    [
        datetime(2024, 5, 1, 12, 0, tzinfo=UTC),
        datetime(2024, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        datetime(2025, 1, 1, 0, 30, 0, 5, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        datetime(2024, 3, 1, 20, 0, 1, 10, tzinfo=timezone(timedelta(hours=-7))),
        datetime(999, 2, 3, 4, 5, 6, 7, tzinfo=UTC),
        datetime.fromtimestamp(1_795_000_000.123456, UTC),
    ],
)
def test_a_time_is_stored_as_sqlalchemys_sqlite_text(at: datetime) -> None:
    """`sqlite_time` formats the fields itself; the text is what `isoformat` gives in UTC."""
    assert sqlite_writer.sqlite_time(at) == at.astimezone(UTC).isoformat(" ", "microseconds")[:26]
