"""The writer's pace: the further behind the records it has to write, the longer it works
between two turns of the event loop given to the relay (`turns.budget`), so a relay that keeps
the loop busy cannot leave it behind until the journal is full."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.store import lookahead, sqlite_writer
from proxy.store.turns import MAX_BUDGET, WORK_BUDGET, Turns, budget
from tests.conftest import until as wait_until
from tests.dbs import chat_exchange
from tests.store import test_recorder
from tests.store.test_recorder import assert_stored_once, config, started

sqlite_db = test_recorder.sqlite_db  # fixture


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
