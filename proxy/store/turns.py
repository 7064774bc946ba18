"""Background work that shares the event loop's thread with the relay.

The recorder builds rows and writes SQLite on the loop's thread (a worker thread cost more CPU
in trading the GIL than the work itself). Every request the loop serves meanwhile waits, at
each of its few turns of the loop, for whatever background step runs before it; so the steps
are short while the writer keeps up, and bounded when it is far behind (`MAX_STRETCH`).
`Turns` measures instead of counting rows: records differ a hundredfold in size. How long a
step is depends on how far behind the writer is and on how long the relay's turns take
(`pace`), and for work beside a server's also on how busy the loop is (`beside_server`).
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
MAX_SHARE = 8.0
"""The most a writer far behind works between two of the relay's turns, as a multiple of the
relay's turn before (`share`)."""
MAX_STRETCH = 0.1
"""The longest stretch a writer far behind takes however long the relay's turn before was (a
full collection of the garbage collector, thousands of streams): the most it adds to a
request's wait at one turn of the loop."""


def steady(others: float = 0.0) -> float:
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


def share(waiting: int, batch: int) -> float:
    """How long the writer may work between two of the relay's turns, as a multiple of the
    relay's turn before, with `waiting` records behind it: nothing while two batches or fewer
    wait, then a quarter more for each batch, up to `MAX_SHARE`.

    `budget` bounds a stretch in seconds; a relay whose turns take long (large bodies, many
    connections) then leaves a writer behind a smaller and smaller part of the loop: with
    responses of 100 logprob tokens at 64 connections, a few percent, and the journal grew
    until it would have been full (docs/performance.md). Grown with the relay's turns, the
    writer's part of the loop grows with what waits, and the relay slows down. `waiting`
    counts the records in memory, at most `queue_size`: with the defaults (10,000 and
    batches of 500) the share reaches 4.5 at most."""
    return min(max(0.0, (waiting / batch - 2) / 4), MAX_SHARE)


def pace(waiting: int, batch: int, others: float) -> float:
    """The writer's next stretch of work, with `waiting` records behind it, after the relay's
    turn took `others` seconds: `budget`, or `share` times that turn if longer, up to
    `MAX_STRETCH`."""
    return max(budget(waiting, batch), min(share(waiting, batch) * others, MAX_STRETCH))


def beside_server(waiting: int, batch: int, others: float) -> float:
    """`pace` for work done while a server works on statements the same task waits for (the
    PostgreSQL writer's rows built ahead, `store.lookahead`): `budget` no longer than the
    loop's other work at the turn before, never shorter than `WORK_BUDGET`. Without `share`:
    on a quiet loop the other work is mostly the writer's own (its statements, their
    replies), and a multiple of it would leave the server idle (`store.lookahead` gives the
    share once the batch before is committed and the writer waits for these rows).

    Behind a busy relay the writer takes its whole budget: otherwise a saturated worker recorded
    a fraction of what it served (docs/performance.md). A loop with little else to do than the
    writer's own statements comes back soon, and the stretches stay short, so the server's
    reply to a statement in flight is read soon after it comes instead of after a long
    stretch, which would leave the server idle."""
    return max(WORK_BUDGET, min(budget(waiting, batch), others))


class Turns:
    """`await turns.give()` after each small unit of work: yields to the loop once the stretch
    `pace` gives has passed since the last yield. `pace` is asked at each turn, with the seconds
    the loop's other work took at the turn just given (0 before the first). That other work
    includes the writer's own, such as the replies to its statements."""

    __slots__ = ("_due", "_pace")

    def __init__(self, pace: Callable[[float], float] = steady) -> None:
        self._pace = pace
        self._due = perf_counter() + pace(0.0)

    async def give(self) -> None:
        yielded = perf_counter()
        if yielded >= self._due:
            await asyncio.sleep(0)
            back = perf_counter()
            self._due = back + self._pace(back - yielded)
