"""The backlog hands the writer the batch after one that is not committed yet: from memory or
from the journal file, across sealed segments, and commits nothing the writer did not."""

from __future__ import annotations

import gc
import logging
from pathlib import Path
from typing import Any

import pytest

from proxy.exchange import Exchange
from proxy.store.backlog import BUILT_FROM, UNENCODED, Backlog, Built, Pending
from proxy.store.journal import Journal
from proxy.store.lines import decode, encode
from proxy.store.losses import Losses
from proxy.store.rows import Rows, rows_for
from tests.dbs import chat_exchange


def opened(tmp_path: Path, queue_size: int, max_bytes: int = 1 << 20) -> Backlog:
    journal = Journal(tmp_path / "records.spool", max_bytes)
    journal.open()
    backlog = Backlog(journal, Losses(journal), queue_size)
    backlog.opened()
    return backlog


def journaled(backlog: Backlog, count: int) -> list[Exchange]:
    """`count` records added and journaled in one write, as at the end of a turn of the loop."""
    sent = [chat_exchange() for _ in range(count)]
    for ex in sent:
        backlog.add(ex)
    backlog.flush()
    return sent


def ids(records: list[Exchange] | list[Pending]) -> list[str]:
    return [record.id for record in records]


async def test_the_batch_after_an_uncommitted_one_comes_from_memory(tmp_path: Path) -> None:
    backlog = opened(tmp_path, queue_size=100)
    sent = journaled(backlog, 25)
    first = await backlog.next_batch(10, 0.0)
    assert first is not None and first[1] is not None
    second = await backlog.next_batch(10, 0.0, after=first[1])
    assert second is not None
    assert ids(first[0]) + ids(second[0]) == ids(sent[:20])
    assert backlog.journal.done == (1, 0)  # nothing is committed until the writer says so
    backlog.commit(first)
    assert backlog.journal.done == first[1]
    backlog.commit(second)
    assert backlog.journal.done == second[1]
    third = await backlog.next_batch(10, 0.0)
    assert third is not None and ids(third[0]) == ids(sent[20:])


async def test_past_the_memory_the_batch_after_is_read_from_the_file(tmp_path: Path) -> None:
    backlog = opened(tmp_path, queue_size=5)
    sent = journaled(backlog, 25)
    assert len(backlog) == 5  # the other 20 are in the journal only
    taken: list[Pending] = []
    after = None
    for _ in range(3):
        batch = await backlog.next_batch(10, 0.0, after=after)
        assert batch is not None and batch[1] is not None
        taken += batch[0]
        after = batch[1]
    assert ids(taken) == ids(sent)
    assert backlog.journal.done == (1, 0)
    assert await backlog.next_batch(10, 0.0, after=after) is None


async def test_the_batch_after_one_ending_a_sealed_segment_starts_the_next(tmp_path: Path) -> None:
    line = len(encode(chat_exchange()))
    backlog = opened(tmp_path, queue_size=0, max_bytes=400 * line)  # segments of ~4 KiB or more
    sent = [chat_exchange() for _ in range(3 * (backlog.journal.segment_bytes // line + 1))]
    for ex in sent:
        backlog.add(ex)
        backlog.flush()  # one append each, so the live segment is sealed once past its size
    assert backlog.journal.live >= 3
    batches = []
    after = None
    for _ in range(10):
        batch = await backlog.next_batch(len(sent), 0.0, after=after)
        if batch is None:
            break
        batches.append(batch)
        after = batch[1]
    assert [ex.id for batch in batches for ex in batch[0]] == ids(sent)
    holding = backlog.journal.live - (backlog.journal.size == 0)  # the live one may be empty
    assert len(batches) == holding  # one a segment, read one after the other
    assert backlog.journal.done == (1, 0)
    assert len(list(tmp_path.glob("records.spool.seg*"))) == backlog.journal.live - 1  # noqa: ASYNC240
    for batch in batches:
        backlog.commit(batch)
    assert await backlog.next_batch(len(sent), 0.0) is None  # a segment read to its end: done
    assert not list(tmp_path.glob("records.spool.seg*"))  # noqa: ASYNC240 - deleted once committed


async def test_lines_that_are_not_records_after_an_uncommitted_batch_wait_their_turn(
    tmp_path: Path,
) -> None:
    backlog = opened(tmp_path, queue_size=0)
    sent = journaled(backlog, 3)
    assert backlog.journal.append([b"not a record\n"]) is not None
    first = await backlog.next_batch(3, 0.0)
    assert first is not None and ids(first[0]) == ids(sent)
    rest = await backlog.next_batch(3, 0.0, after=first[1])
    # Handed back without records, to be committed after the batch before it, not at once.
    assert rest is not None and rest[0] == [] and rest[1] == backlog.journal.end
    assert backlog.journal.done == (1, 0)
    assert (tmp_path / "records.spool.bad").read_bytes() == b"not a record\n"
    backlog.commit(first)
    backlog.commit(rest)
    assert backlog.journal.done == backlog.journal.end
    assert backlog.done()


def containers(root: Any) -> int:
    """The dicts and lists the collector tracks that `root` holds, however deep (through
    containers and the record's own objects, not their classes)."""
    seen: set[int] = set()
    found, todo = 0, [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or not gc.is_tracked(obj) or isinstance(obj, type):
            continue
        seen.add(id(obj))
        found += isinstance(obj, dict | list)
        if isinstance(obj, dict | list | tuple | Exchange | Built | Rows):
            todo.extend(gc.get_referents(obj))
    return found


async def test_a_long_record_waits_as_its_line_and_rows_not_as_its_parsed_response(
    tmp_path: Path,
) -> None:
    """A response with logprobs parses into dicts and lists by the hundred; a record waiting
    for the writer keeps none of them once journaled, only its line and its rows, which are
    what the writer would have built."""
    backlog = opened(tmp_path, queue_size=100)
    long = chat_exchange(logprobs=[f"t{i}" for i in range(300)])
    short = chat_exchange()
    assert len(encode(long)) >= BUILT_FROM > len(encode(short))
    assert containers(long) > 900
    expected, line = rows_for(long), encode(long)
    for ex in (long, short):
        backlog.add(ex)
    backlog.flush()
    batch = await backlog.next_batch(10, 0.0)
    assert batch is not None
    built, plain = batch[0]
    assert plain is short
    assert isinstance(built, Built) and built.id == long.id
    assert built.rows == expected and len(built.rows.logprobs) == 300
    assert built.line == line and decode(built.line).id == long.id
    assert containers(built) < 20


async def test_records_the_journal_refuses_wait_in_memory_long_ones_as_their_rows(
    tmp_path: Path,
) -> None:
    """A full journal: records are kept in memory only, the long one still without its parsed
    response, and handed to the writer with no journal position to commit."""
    backlog = opened(tmp_path, queue_size=100, max_bytes=4096)
    long = chat_exchange(logprobs=[f"t{i}" for i in range(300)])
    short = chat_exchange()
    for ex in (long, short):
        backlog.add(ex)
    backlog.flush()
    assert backlog.journal.problem and backlog.losses.in_memory_total == 2
    batch = await backlog.next_batch(10, 0.0)
    assert batch is not None and batch[1] is None
    built, plain = batch[0]
    assert isinstance(built, Built) and built.rows == rows_for(long) and plain is short
    assert containers(built) < 20


async def test_long_records_past_the_memory_wait_in_the_journal_only(tmp_path: Path) -> None:
    """Memory holds `queue_size` records, long ones as `Built`; the rest are read back from
    the file as exchanges, whose rows the writer builds then."""
    backlog = opened(tmp_path, queue_size=2)
    sent = [chat_exchange(logprobs=[f"t{i}" for i in range(300)]) for _ in range(4)]
    for ex in sent:
        backlog.add(ex)
    backlog.flush()
    assert len(backlog) == 2
    first = await backlog.next_batch(10, 0.0)
    assert first is not None and all(isinstance(r, Built) for r in first[0])
    rest = await backlog.next_batch(10, 0.0, after=first[1])
    assert rest is not None and all(isinstance(r, Exchange) for r in rest[0])
    assert ids(first[0]) + ids(rest[0]) == ids(sent)
    assert [rows_for(r) for r in rest[0] if isinstance(r, Exchange)] == [
        rows_for(ex) for ex in sent[2:]
    ]


async def test_a_record_without_a_journal_line_waits_in_memory_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A record that cannot be encoded (here tags that hold themselves) is kept in memory and
    handed over first; the records of its turn are journaled as usual, and the log says why."""
    backlog = opened(tmp_path, queue_size=100)
    tags: dict[str, Any] = {}
    tags["self"] = tags
    odd = chat_exchange(tags=tags)
    sent = [chat_exchange(), odd, chat_exchange(logprobs=[f"t{i}" for i in range(300)])]
    with caplog.at_level(logging.WARNING):
        for ex in sent:
            backlog.add(ex)
        backlog.flush()
        backlog.losses.report(force=True)
    assert backlog.journaled == 2 and backlog.losses.in_memory_total == 1
    loose = await backlog.next_batch(10, 0.0)
    assert loose is not None and loose[0] == [odd] and loose[1] is None
    journaled = await backlog.next_batch(10, 0.0)
    assert journaled is not None and ids(journaled[0]) == ids([sent[0], sent[2]])
    assert any(
        f"exchange {odd.id}: its journal line failed" in r.getMessage() for r in caplog.records
    )
    assert any(UNENCODED in r.getMessage() for r in caplog.records)
