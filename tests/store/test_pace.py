"""The writer's pace: the further behind the records it has to write, the longer it works
between two turns of the event loop given to the relay (`turns.budget`), so a relay that keeps
the loop busy cannot leave it behind until the journal is full."""

from __future__ import annotations

import asyncio
import statistics
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from time import perf_counter

import pytest

from proxy import serve
from proxy.store import lookahead, sqlite_writer, upgrade
from proxy.store.backlog import Backlog
from proxy.store.journal import Journal
from proxy.store.losses import Losses
from proxy.store.turns import (
    MAX_BUDGET,
    MAX_SHARE,
    MAX_STRETCH,
    WORK_BUDGET,
    Turns,
    beside_server,
    budget,
    pace,
    share,
)
from tests.conftest import until as wait_until
from tests.dbs import chat_exchange
from tests.store import test_recorder
from tests.store.test_recorder import assert_stored_once, config, started

sqlite_db = test_recorder.sqlite_db  # fixture
pg_url = test_recorder.pg_url  # fixture


def test_the_budget_grows_with_the_batches_waiting_up_to_its_cap() -> None:
    assert budget(0, 500) == WORK_BUDGET
    assert budget(500, 500) == WORK_BUDGET  # a batch or less: the writer keeps up
    assert budget(1500, 500) == pytest.approx(3 * WORK_BUDGET)
    assert budget(10_000, 500) == pytest.approx(min(20 * WORK_BUDGET, MAX_BUDGET))
    assert budget(10**6, 500) == MAX_BUDGET


@pytest.mark.parametrize(
    ("count", "first"),
    [
        (600, 5 * WORK_BUDGET),  # five batches wait behind the first one taken
        (2_000, MAX_BUDGET),  # nineteen: past the cap
    ],
)
async def test_a_writer_behind_works_longer_between_turns_until_it_has_caught_up(
    sqlite_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int, first: float
) -> None:
    given: list[tuple[str, float]] = []

    def watched(where: str) -> type[Turns]:
        class Watched(Turns):
            def __init__(self, pace: Callable[[float], float]) -> None:
                given.append((where, pace(0.0)))  # the first stretch's budget
                super().__init__(pace)

        return Watched

    monkeypatch.setattr(sqlite_writer, "Turns", watched("insert"))
    monkeypatch.setattr(lookahead, "Turns", watched("build"))
    recorder = await started(config(sqlite_db, tmp_path, batch_size=100))
    sent = [chat_exchange() for _ in range(count)]
    try:
        for ex in sent:
            recorder.accept(ex)  # many batches at once: the writer is behind
        await wait_until(lambda: recorder.written == len(sent), within=60)
    finally:
        await recorder.stop()
    await assert_stored_once(sqlite_db, sent)
    for where in ("build", "insert"):
        budgets = [b for w, b in given if w == where]
        assert len(budgets) == count // 100, where  # one a batch
        assert budgets[0] == pytest.approx(first), where
        assert budgets == sorted(budgets, reverse=True), where  # shorter as it catches up
        assert budgets[-1] == WORK_BUDGET, where  # caught up: the relay's turns as before


def burn(seconds: float) -> None:
    """Work on the loop's thread for `seconds` without yielding, as a busy relay's turn does."""
    until = perf_counter() + seconds
    while perf_counter() < until:
        pass


class Relay:
    """A neighbour on the event loop that takes `turn` seconds at each of its turns, counting
    them and the time they really took (a turn the machine preempted runs longer), until
    stopped."""

    def __init__(self, turn: float) -> None:
        self.turn = turn
        self.turns = 0
        self.spent = 0.0
        self.running = True

    async def run(self) -> None:
        while self.running:
            began = perf_counter()
            burn(self.turn)
            self.spent += perf_counter() - began
            self.turns += 1
            await asyncio.sleep(0)


async def stretches(relay_turn: float, pace: Callable[[float], float]) -> list[float]:
    """How long `Turns` with `pace` works between two of the relay's turns, for a relay whose
    turns each take `relay_turn` seconds."""
    relay = Relay(relay_turn)
    neighbour = asyncio.create_task(relay.run())
    await asyncio.sleep(0)
    turns = Turns(pace)
    found: list[float] = []
    began, seen, spent = perf_counter(), relay.turns, relay.spent
    while len(found) < 40:
        burn(0.00002)  # a small unit of work: a record's rows
        await turns.give()
        if relay.turns != seen:  # the relay had a turn: a stretch ended before it
            now = perf_counter()
            found.append(now - began - (relay.spent - spent))
            began, seen, spent = now, relay.turns, relay.spent
    relay.running = False
    await neighbour
    return found


def test_far_behind_the_writer_takes_a_part_of_the_loop_that_grows_with_what_waits() -> None:
    assert share(200, 100) == 0.0  # two batches: `budget` alone
    assert share(600, 100) == pytest.approx(1.0)  # six: as long as the relay's turn
    assert share(10_000, 100) == MAX_SHARE
    assert pace(10_000, 100, others=0.0) == MAX_BUDGET  # a quiet loop: the budget's cap
    assert pace(10_000, 100, others=0.01) == pytest.approx(MAX_SHARE * 0.01)
    assert pace(10_000, 100, others=2.0) == MAX_STRETCH  # a long pause is not taken 8 times
    assert pace(100, 100, others=0.1) == WORK_BUDGET  # caught up: as before, however busy


async def test_a_writer_far_behind_a_relay_with_long_turns_works_a_multiple_of_them() -> None:
    """With long turns of the relay (large bodies, many connections) a writer far behind
    works `MAX_SHARE` times as long as the relay between two of them, not `MAX_BUDGET`."""
    found = await stretches(relay_turn=0.005, pace=lambda others: pace(10_000, 100, others))
    assert statistics.median(found) >= 0.8 * MAX_SHARE * 0.005


async def test_beside_a_server_the_stretches_grow_only_as_long_as_the_relays_turns() -> None:
    """A busy relay leaves a writer behind its whole pace at each turn; a loop with little else
    to do gets its turns back at once, so the batch in the server's hands is not kept waiting
    behind a long stretch."""

    def six_batches_behind(others: float) -> float:  # `budget` 1.2 ms
        return beside_server(600, 100, others)

    def caught_up(others: float) -> float:
        return beside_server(100, 100, others)

    idle = await stretches(relay_turn=0.0, pace=six_batches_behind)
    busy = await stretches(relay_turn=0.005, pace=six_batches_behind)
    caught_up_beside_busy = await stretches(relay_turn=0.005, pace=caught_up)
    assert WORK_BUDGET <= statistics.median(idle) < 2 * WORK_BUDGET < budget(600, 100)
    assert statistics.median(busy) >= 0.8 * budget(600, 100)  # its whole budget
    assert statistics.median(caught_up_beside_busy) < 2 * WORK_BUDGET


def watched(granted: list[float], only: Callable[[Callable[[float], float]], bool]) -> type[Turns]:
    """`Turns` that appends to `granted` each stretch it grants after a turn, for the paces
    `only` picks."""

    class Watched(Turns):
        def __init__(self, pace: Callable[[float], float]) -> None:
            super().__init__(pace)
            self.watched = only(pace)

        async def give(self) -> None:
            due = self._due
            await super().give()
            if self.watched and self._due != due:
                granted.append(self._due - perf_counter())

    return Watched


@contextmanager
def threads_as_served() -> Iterator[None]:
    """The switch interval `serve` runs with (`serve.tune_threads`), for the block only."""
    previous = sys.getswitchinterval()
    serve.tune_threads()
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


async def test_a_thread_the_writer_waits_on_gets_its_turn_behind_a_busy_loop() -> None:
    """Behind a loop whose turns each take 5 ms of CPU, work handed to a thread (the SQLite
    writer's COMMIT) comes back within a few of those turns, as `serve` runs. With Python's
    default switch interval the waiting thread was woken by every poll of the loop, lost the
    GIL to it each time and waited anew: seconds on some machines."""
    relay = Relay(0.005)
    with threads_as_served():
        neighbour = asyncio.create_task(relay.run())
        try:
            waits = []
            for _ in range(20):
                began = perf_counter()
                await asyncio.to_thread(sum, range(1_000))
                waits.append(perf_counter() - began)
                if waits[-1] >= 0.5:
                    break  # failed already: the next ones could take seconds each
        finally:
            relay.running = False
            await neighbour
    assert max(waits) < 0.5, waits
    assert statistics.median(waits) < 0.05, waits
    assert relay.turns >= 20, "the neighbour did not keep the loop busy"


async def stored_behind_a_busy_relay(url: str, tmp_path: Path, tokens: int = 0) -> None:
    """Hand a recorder 2,000 records at once (batches of 100: the writer far behind), each
    with `tokens` logprob tokens, while a neighbour takes 5 ms at each of its turns of the
    loop, threads switched as `serve` switches them; every record is stored once."""
    relay = Relay(0.005)
    logprobs = [f" t{i}" for i in range(tokens)] or None
    sent = [chat_exchange(logprobs=logprobs) for _ in range(2_000)]
    with threads_as_served():
        recorder = await started(config(url, tmp_path, batch_size=100))
        neighbour = asyncio.create_task(relay.run())
        try:
            for ex in sent:
                recorder.accept(ex)
            await wait_until(lambda: recorder.written == len(sent), within=60)
        finally:
            relay.running = False
            await neighbour
            await recorder.stop()
    await assert_stored_once(url, sent, tokens=tokens)


async def test_a_postgresql_writer_behind_a_busy_relay_builds_ahead_in_longer_stretches(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows built ahead take longer stretches once a busy relay leaves the writer behind:
    the writer's budget while the server writes the batch before, and its share of the loop,
    longer than any budget, once that batch is committed and the writer waits for them."""
    await upgrade(pg_url)
    granted: list[float] = []

    def ahead(pace: Callable[[float], float]) -> bool:
        return getattr(pace, "__func__", None) is lookahead.Batches.beside_server

    monkeypatch.setattr(lookahead, "Turns", watched(granted, ahead))
    await stored_behind_a_busy_relay(pg_url, tmp_path, tokens=3)
    assert granted, "no rows were built ahead, beside the server's work"
    assert max(granted) > 4 * WORK_BUDGET


async def test_rows_built_ahead_take_the_share_once_the_batch_before_is_committed(
    tmp_path: Path,
) -> None:
    """While the server writes the batch before, rows built ahead stay within the budget
    however long the relay's turn was; once it is committed and the writer waits for them,
    they take the writer's share of the loop, as rows of a batch held do."""
    journal = Journal(tmp_path / "records.spool", 1 << 30)
    journal.open()
    backlog = Backlog(journal, Losses(journal), queue_size=10_000)
    for _ in range(1_000):
        backlog.add(chat_exchange())
    backlog.flush()  # journaled, and held in memory for the writer
    assert len(backlog) == 1_000
    batches = lookahead.Batches(backlog, 100)
    relay_turn = 0.005
    batches.held = lookahead.Taken(([], None))
    assert batches.beside_server(relay_turn) == budget(1_000, 100)
    batches.held = None
    assert batches.beside_server(relay_turn) == pace(1_000, 100, relay_turn)
    assert batches.beside_server(relay_turn) == pytest.approx(share(1_000, 100) * relay_turn)
    assert batches.beside_server(relay_turn) > MAX_BUDGET
    journal.close()


async def test_a_sqlite_writer_far_behind_a_busy_relay_outlasts_the_budgets_cap(
    sqlite_db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Behind a relay whose turns take 5 ms, the INSERTs of a writer far behind run in
    stretches longer than `MAX_BUDGET`."""
    granted: list[float] = []
    monkeypatch.setattr(sqlite_writer, "Turns", watched(granted, lambda pace: True))
    # 20 logprob tokens each: a batch's INSERTs outlast a first stretch on any machine.
    await stored_behind_a_busy_relay(sqlite_db, tmp_path, tokens=20)
    assert granted, "no INSERTs were cut by a turn"
    assert max(granted) > 2 * MAX_BUDGET
