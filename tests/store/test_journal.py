"""The journal: durable on arrival, carried on after a crash, an expired grace or a stall, bounded,
and never in the way of the traffic when its disk refuses it."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy.engine import make_url

from proxy.exchange import Exchange
from proxy.store import upgrade
from proxy.store.journal import Journal
from proxy.store.lines import SOURCE_FROM, decode, encode
from proxy.store.recorder import PG_WRITE_COMMAND_TIMEOUT, STALLED_AFTER
from proxy.usage import Usage
from tests import dbs
from tests.conftest import until as wait_until
from tests.dbs import chat_exchange
from tests.store import test_recorder
from tests.store.test_recorder import (
    SqliteLock,
    assert_stored_once,
    config,
    query,
    spool_files,
    started,
)
from tests.tcprelay import TcpRelay

sqlite_db = test_recorder.sqlite_db  # fixture
pg_url = dbs.pg_url  # fixture

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import asyncio, sys
from dataclasses import replace
from proxy.config import Config
from proxy.store.recorder import DatabaseRecorder
from tests.dbs import chat_exchange

async def main(url: str, spool: str, count: int) -> None:
    config = replace(Config(), db_url=url, spool_path=spool, batch_interval=60.0)
    recorder = DatabaseRecorder(config)
    await recorder.start()
    ids = []
    for _ in range(count):
        ex = chat_exchange()
        recorder.accept(ex)
        ids.append(ex.id)
    await asyncio.sleep(0.01)  # longer than the journal's delay, far shorter than a batch
    print(" ".join(ids), flush=True)
    await asyncio.sleep(60)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def lines_of(tmp_path: Path) -> list[bytes]:
    return (tmp_path / "records.spool").read_bytes().splitlines()


async def test_kill_9_loses_nothing_journaled(sqlite_db: str, tmp_path: Path) -> None:
    spool = str(tmp_path / "records.spool")
    child = subprocess.Popen(  # noqa: ASYNC220 - read from a thread below
        [sys.executable, "-c", CHILD, sqlite_db, spool, "300"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        ids = (await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 30)).split()
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
    assert len(ids) == 300
    assert await query(sqlite_db, "SELECT count(*) FROM exchanges") == [(0,)]  # batch not due
    again = await started(config(sqlite_db, tmp_path))  # the next start carries on
    await again.stop()
    stored = await query(sqlite_db, "SELECT id FROM exchanges")
    assert sorted(row[0] for row in stored) == sorted(i.decode() for i in ids)


async def test_an_expired_grace_loses_nothing_journaled(sqlite_db: str, tmp_path: Path) -> None:
    cfg = config(sqlite_db, tmp_path, shutdown_grace=0.5)
    sent = [chat_exchange() for _ in range(40)]
    with SqliteLock(sqlite_db):
        # The writer waits on the lock for up to 10 s: the grace runs out mid-batch.
        recorder = await started(cfg, busy_timeout_ms=10_000)
        for ex in sent:
            recorder.accept(ex)
        await wait_until(lambda: recorder._batches.held is not None)
        began = time.monotonic()
        await recorder.stop()
        assert time.monotonic() - began < 2.0
    again = await started(cfg)
    await again.stop()
    await assert_stored_once(sqlite_db, sent)
    assert spool_files(tmp_path) == []


def relayed(url: str, relay: TcpRelay) -> str:
    target = make_url(url)
    port = relay.start(target.host or "127.0.0.1", target.port or 5432)
    return target.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)


async def test_a_stalled_postgres_is_noticed_in_seconds_and_loses_nothing(
    pg_url: str, tmp_path: Path
) -> None:
    await upgrade(pg_url)
    with TcpRelay() as relay:
        cfg = config(relayed(pg_url, relay), tmp_path, shutdown_grace=1.0)
        recorder = await started(cfg)
        first = [chat_exchange() for _ in range(5)]
        for ex in first:
            recorder.accept(ex)
        deadline = time.monotonic() + 10
        while await query(pg_url, "SELECT count(*) FROM exchanges") != [(len(first),)]:
            assert time.monotonic() < deadline, "the first records were not written"
            await asyncio.sleep(0.01)
        await asyncio.to_thread(relay.stall)  # the pooled connection stays open, no bytes
        stalled_at = time.monotonic()
        later = [chat_exchange() for _ in range(20)]
        for ex in later:
            recorder.accept(ex)
        await wait_until(lambda: recorder.readiness() is not None, within=STALLED_AFTER + 3)
        assert (recorder.readiness() or "").startswith("database stalled")
        await wait_until(
            lambda: (recorder.readiness() or "").startswith("database unavailable"),
            within=PG_WRITE_COMMAND_TIMEOUT + 5,
        )
        noticed = time.monotonic() - stalled_at
        await recorder.stop()  # the grace runs out: the stalled batch stays journaled
        await asyncio.to_thread(relay.resume)
        again = await started(cfg)
        await again.stop()
    await assert_stored_once(pg_url, first + later)
    assert noticed < PG_WRITE_COMMAND_TIMEOUT + 5


async def test_segments_are_sealed_read_and_deleted_once_committed(
    sqlite_db: str, tmp_path: Path
) -> None:
    size = len(encode(chat_exchange()))
    # Segments of 10 records; 40 records wait for the database in 4 of them.
    cfg = config(sqlite_db, tmp_path, journal_max_bytes=40 * size, queue_size=5)
    sent = [chat_exchange() for _ in range(60)]
    with SqliteLock(sqlite_db):
        recorder = await started(cfg, busy_timeout_ms=20)
        for ex in sent[:35]:
            recorder.accept(ex)
            await asyncio.sleep(0.001)
        await wait_until(lambda: recorder.readiness() is not None)
        sealed = await asyncio.to_thread(lambda: list(tmp_path.glob("records.spool.seg*")))
        assert len(sealed) >= 2
    await wait_until(lambda: recorder.journal.done == recorder.journal.end)  # all read back
    assert not list(tmp_path.glob("records.spool.seg*"))  # noqa: ASYNC240 - a short listing
    for ex in sent[35:]:
        recorder.accept(ex)
        await asyncio.sleep(0.001)
    await recorder.stop()
    await assert_stored_once(sqlite_db, sent)
    assert spool_files(tmp_path) == []  # sealed segments deleted, the live one emptied
    assert recorder.losses.in_memory_total == recorder.losses.lost_total == 0


async def test_a_full_journal_keeps_records_in_memory_and_says_so(
    sqlite_db: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    size = len(encode(chat_exchange()))
    cfg = config(sqlite_db, tmp_path, journal_max_bytes=10 * size, queue_size=30)
    sent = [chat_exchange() for _ in range(60)]
    with caplog.at_level(logging.WARNING, logger="proxy"), SqliteLock(sqlite_db):
        recorder = await started(cfg, busy_timeout_ms=20)
        for ex in sent:
            recorder.accept(ex)
            await asyncio.sleep(0.001)
        await wait_until(lambda: "full" in (recorder.readiness() or ""), within=5)
    assert recorder.losses.in_memory_total > 0 and recorder.losses.lost_total > 0
    with caplog.at_level(logging.WARNING, logger="proxy"):
        await recorder.stop()
    lost = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
    assert lost and all("journal_max_bytes" in m for m in lost)
    stored = {row[0] for row in await query(sqlite_db, "SELECT id FROM exchanges")}
    # Everything journaled or kept in memory reaches the database; only the lost do not.
    assert len(stored) == len(sent) - recorder.losses.lost_total
    # Each is named in the log, but for those past the first NAMED of a warning ("and N more").
    unnamed = [ex for ex in sent if ex.id not in stored and ex.id not in "".join(lost)]
    assert len(unnamed) == sum(int(n) for m in lost for n in re.findall(r" and (\d+) more", m))


async def test_the_journal_carries_on_where_the_writer_stopped(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j", max_bytes=1 << 20)
    journal.open()
    sent = [chat_exchange() for _ in range(3)]
    ends = journal.append([encode(ex) for ex in sent])
    assert ends is not None and ends[-1] == journal.end
    journal.commit(ends[0])
    journal.close()
    with (tmp_path / "j").open("ab") as f:
        f.write(encode(chat_exchange())[:30])  # a crash in the middle of an append
    again = Journal(tmp_path / "j", max_bytes=1 << 20)
    again.open()
    assert again.done == ends[0]
    more = chat_exchange()
    assert again.append([encode(more)]) is not None  # on a line of its own
    with again.open_segment(again.done[0]) as f:
        found, _ = again.read(f, again.done, again.limit(again.done) or 0, 100)
    assert [ex.id for ex, _ in found] == [sent[1].id, sent[2].id, more.id]
    assert len((tmp_path / "j.bad").read_bytes().splitlines()) == 1
    again.close()
    assert os.stat(tmp_path / "j").st_mode & 0o777 == 0o600


def test_a_restart_reads_on_from_the_sealed_segment_it_stopped_in(tmp_path: Path) -> None:
    line = encode(chat_exchange())
    journal = Journal(tmp_path / "j", max_bytes=4 * 3 * len(line))  # segments of 3-4 records
    journal.open()
    ends = []
    for _ in range(8):
        appended = journal.append([encode(chat_exchange())])
        assert appended is not None
        ends += appended
    assert sorted(p.name for p in tmp_path.glob("j.seg*")) == ["j.seg1", "j.seg2"]
    first = next(i for i, end in enumerate(ends) if end[0] == 2)
    journal.commit(ends[first])  # into the second segment: the first is deleted
    assert not (tmp_path / "j.seg1").exists()
    journal.close()  # as a crash would leave it: nothing more committed

    again = Journal(tmp_path / "j", max_bytes=4 * 3 * len(line))
    again.open()
    assert (again.done, again.live) == (ends[first], 3)
    read = []
    at = again.done
    while at < again.end:
        with again.open_segment(at[0]) as f:
            found, stop = again.read(f, at, again.limit(at) or 0, 100)
        read += [end for _, end in found]
        at = again.next_segment((at[0], stop)) or (at[0], stop)
    assert read == ends[first + 1 :]
    again.close()


def test_a_record_with_keys_or_numbers_orjson_refuses_is_journaled_all_the_same() -> None:
    """Keys that are not text (a form read by code, not JSON) and ints beyond 64 bits take the
    slower encoders; the line decodes to the record as JSON would have it."""
    ex = chat_exchange()
    assert decode(encode(ex)).response_json == ex.response_json
    ex.response_body = None  # JSON made by code has no text of its own
    ex.response_json = {1: "one", "two": [2]}
    assert decode(encode(ex)).response_json == {"1": "one", "two": [2]}
    ex.response_json = {1: "one", "big": 1 << 70}
    assert decode(encode(ex)).response_json == {"1": "one", "big": 1 << 70}


def test_a_body_goes_into_the_line_as_the_text_it_was_parsed_from() -> None:
    """The line holds a long body's own text (key order and spacing kept, as the database
    keeps it), still one line when the body spans several, and decodes to the body's JSON."""
    pad = b"x" * SOURCE_FROM
    text = b'{"z": 1,\n  "a": [1.5, "\\n"],\r\n "w\xc3\xa9": {"k": null}, "p": "' + pad + b'"}\n'
    ex = chat_exchange(response_json=orjson.loads(text), response_body=text)
    line = encode(ex)
    assert line.count(b"\n") == 1 and line.endswith(b"\n")
    assert b'"response_json":{"z": 1,   "a": [1.5, "\\n"],\r  "w\xc3\xa9"' in line
    assert decode(line).response_json == orjson.loads(text)
    assert decode(line).request_json == ex.request_json
    # With a value orjson refuses elsewhere in the record, the bodies are serialised again.
    ex.usage = {"prompt_tokens": 1 << 70}
    back = decode(encode(ex))
    assert back.response_json == orjson.loads(text) and back.usage == ex.usage
    # A short body is serialised: cheaper than looking at its text.
    short = b'{"z": 1,  "a": 2}'
    ex = chat_exchange(response_json=orjson.loads(short), response_body=short)
    assert b'"response_json":{"z":1,"a":2}' in encode(ex)


def test_bytes_that_cannot_be_the_text_of_the_json_are_not_taken_for_it() -> None:
    """Bytes that are not UTF-8, or do not open and close as the JSON does, cannot be its
    source: the JSON is serialised."""
    pad = b"x" * SOURCE_FROM
    for body in (b'{"a": "\xff' + pad + b'"}', b"not its text " + pad, b'"' + pad + b'"'):
        ex = chat_exchange(response_json={"a": 1}, response_body=body)
        assert decode(encode(ex)).response_json == {"a": 1}


def test_a_journal_line_holds_every_field_of_the_exchange_in_its_order() -> None:
    """`encode` spells the fields out: a field added to `Exchange` must be added there too."""
    ex = chat_exchange(tags={"team": "a"})
    ex.request_body, ex.omit_response, ex.tokens = b"raw", True, Usage(*range(len(Usage._fields)))
    ex.raw_stream_gz, ex.raw_pacing = b"gz", [(1, 2.0)]
    record = orjson.loads(encode(ex))["exchange"]
    assert list(record) == [f.name for f in fields(Exchange)]
    assert record["request_body"] is None  # the JSON is kept, so the raw body is not
    assert record["response_json"] is None and record["raw_stream_gz"] is None  # omitted
    assert record["tokens"] == list(ex.tokens)
    back = decode(encode(ex))
    for f in fields(Exchange):
        if f.name not in ("request_body", "response_json", "response_body", "raw_stream_gz"):
            assert getattr(back, f.name) == getattr(ex, f.name), f.name
    # The line starts from a dict of every key: a field `encode` forgot would still be there,
    # as null. Each field, set alone to a value of its own, must reach the line.
    bodies = {"request_body", "request_json", "response_body", "response_json", "raw_stream_gz"}
    for f in fields(Exchange):
        if f.name not in bodies:
            mark: dict[str, Any] = {f.name: "marked"}
            marked = orjson.loads(encode(replace(ex, **mark)))["exchange"]
            assert marked[f.name] in ("marked", list("marked")), f.name
