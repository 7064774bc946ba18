"""The writer's pace: the further behind the records it has to write, the longer it works
between two turns of the event loop given to the relay (`turns.budget`), so a relay that keeps
the loop busy cannot leave it behind until the journal is full."""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path
from time import perf_counter

import pytest

from proxy.store import lookahead, sqlite_writer, upgrade
from proxy.store.turns import MAX_BUDGET, WORK_BUDGET, Sharing, Turns, budget
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
            def __init__(self, budget: float) -> None:
                given.append((where, budget))
                super().__init__(budget)

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
    them, until stopped."""

    def __init__(self, turn: float) -> None:
        self.turn = turn
        self.turns = 0
        self.running = True

    async def run(self) -> None:
        while self.running:
            burn(self.turn)
            self.turns += 1
            await asyncio.sleep(0)


async def stretches(relay_turn: float, units: int = 3_000) -> list[float]:
    """How long `Sharing`, asked for `MAX_BUDGET`, works between two of the relay's turns, for
    a relay whose turns each take `relay_turn` seconds."""
    relay = Relay(relay_turn)
    neighbour = asyncio.create_task(relay.run())
    await asyncio.sleep(0)
    sharing = Sharing(lambda: MAX_BUDGET)
    found: list[float] = []
    began, seen = perf_counter(), relay.turns
    for _ in range(units):
        burn(0.00002)  # a small unit of work: a record's rows
        await sharing.give()
        if relay.turns != seen:  # the relay had a turn: a stretch ended before it
            now = perf_counter()
            found.append(now - began - relay_turn * (relay.turns - seen))
            began, seen = now, relay.turns
    relay.running = False
    await neighbour
    return found


async def test_beside_a_server_the_stretches_grow_only_as_long_as_the_relays_turns() -> None:
    """A busy relay leaves a writer behind the whole `pace` at each turn; a loop with little
    else to do gets its turns back at once, so the batch in the server's hands is not kept
    waiting behind a long stretch."""
    idle = statistics.median(await stretches(relay_turn=0.0))
    busy = statistics.median(await stretches(relay_turn=0.005))
    assert idle < 2 * WORK_BUDGET < MAX_BUDGET
    assert busy >= 0.8 * MAX_BUDGET


async def test_a_postgresql_writer_behind_a_busy_relay_builds_ahead_in_longer_stretches(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows built ahead, while the server writes the batch before, take longer stretches
    once a busy relay leaves the writer behind; every record is stored once."""
    await upgrade(pg_url)
    granted: list[float] = []

    class Watched(Sharing):
        async def give(self) -> None:
            due = self._due
            await super().give()
            if self._due != due:
                granted.append(self._due - perf_counter())

    monkeypatch.setattr(lookahead, "Sharing", Watched)
    relay = Relay(0.005)
    recorder = await started(config(pg_url, tmp_path, batch_size=100))
    neighbour = asyncio.create_task(relay.run())
    sent = [chat_exchange() for _ in range(2_000)]
    try:
        for ex in sent:
            recorder.accept(ex)  # many batches at once: the writer is behind
        await wait_until(lambda: recorder.written == len(sent), within=60)
    finally:
        relay.running = False
        await neighbour
        await recorder.stop()
    await assert_stored_once(pg_url, sent)
    assert granted, "no rows were built ahead"
    assert max(granted) > 4 * WORK_BUDGET
