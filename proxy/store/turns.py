"""Background work that shares the event loop's thread with the relay.

The recorder builds rows and writes SQLite on the loop's thread (a worker thread cost more CPU
in trading the GIL than the work itself). Every request the loop serves meanwhile waits, at
each of its few turns of the loop, for whatever background step runs before it; so the steps
must be short. `Turns` measures instead of counting rows: records differ a hundredfold in size.
How short depends on how far behind the writer is (`budget`), and for work beside a server's
(`Sharing`) also on how busy the loop is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import perf_counter

WORK_BUDGET = 0.0002
"""Seconds of background work between two turns given to the relay: shorter costs CPU in
extra turns, longer adds to the relay's tail latency (the trade is in docs/performance.md)."""
MAX_BUDGET = 0.002
"""The longest budget a writer that is behind takes (`budget`)."""


def steady() -> float:
    """A writer's pace that never grows: `WORK_BUDGET` (a writer used on its own)."""
    return WORK_BUDGET


def budget(waiting: int, batch: int) -> float:
    """The writer's budget between two turns given to the relay, with `waiting` records
    behind it: `WORK_BUDGET` while a batch or less waits, then as many times that as batches
    wait, up to `MAX_BUDGET`.

    A relay that keeps the loop busy gives the writer a turn only now and then: with a fixed
    budget the writer recorded less than the relay served, and the journal grew until it was
    full (docs/performance.md). The further behind the writer is, the longer it works before
    the relay's next turn, so a saturated worker serves as fast as it can also record.
    `waiting` counts the records held in memory, at most `queue_size`: a `queue_size` of a
    few batches caps the budget lower."""
    behind = waiting / batch
    return WORK_BUDGET if behind <= 1 else min(WORK_BUDGET * behind, MAX_BUDGET)


class Turns:
    """`await turns.give()` after each small unit of work: yields to the loop once
    `budget` seconds have passed since the last yield."""

    __slots__ = ("_budget", "_due")

    def __init__(self, budget: float = WORK_BUDGET) -> None:
        self._budget = budget
        self._due = perf_counter() + budget

    async def give(self) -> None:
        if perf_counter() >= self._due:
            await asyncio.sleep(0)
            self._due = perf_counter() + self._budget


class Sharing(Turns):
    """Turns for work done while a server works on statements the same task waits for (the
    PostgreSQL writer's rows built ahead, `store.lookahead`): each stretch lasts `pace()`, asked
    afresh at each turn, but no longer than the loop's other work took at the turn before it,
    and never shorter than `WORK_BUDGET`.

    A relay that keeps the loop busy gives the writer a turn only now and then, and the
    writer behind then takes as long a stretch as `pace` allows, as on SQLite: otherwise a
    saturated worker recorded a fraction of what it served (docs/performance.md). A loop with
    nothing else to do comes back at once, and the stretches stay short, so the server's reply
    to a statement in flight is read soon after it comes instead of after a long stretch,
    which would leave the server idle."""

    __slots__ = ("_pace",)

    def __init__(self, pace: Callable[[], float]) -> None:
        super().__init__(WORK_BUDGET)
        self._pace = pace

    async def give(self) -> None:
        yielded = perf_counter()
        if yielded >= self._due:
            await asyncio.sleep(0)
            back = perf_counter()
            self._due = back + max(WORK_BUDGET, min(self._pace(), back - yielded))
