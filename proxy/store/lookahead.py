"""The database writer's batches: the one being written, and the next, taken meanwhile.

The writer (`store.recorder`) builds a batch's rows on the event loop's thread, then waits while
the database works on them: the server's work for PostgreSQL, the COMMIT on a worker thread for
SQLite. Meanwhile it takes the next batch from the backlog and builds that one's rows, so they
are ready when the first is committed. One batch ahead is enough for the two to overlap. Only
on PostgreSQL: on SQLite nearly all of the work is the process's own, so there is nothing to
overlap it with.

The batch ahead is written only after the one before it is committed, on the same connection,
so no connection is used by two threads at once; the journal is committed in order, each batch
once it is in the database. After an outage both batches are kept, rows and all, and written
in order again.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from proxy.store import turns
from proxy.store.backlog import Backlog, Batch, Built, Pending, line_of
from proxy.store.journal import Position
from proxy.store.rows import Rows, rows_for
from proxy.store.turns import Turns

log = logging.getLogger(__name__)


@dataclass
class Taken:
    """A batch taken from the backlog, kept until it is committed."""

    batch: Batch
    rows: list[tuple[Pending, Rows]] | None = None
    """Its rows once built; records whose rows cannot be built are set aside instead."""


class Batches:
    def __init__(self, backlog: Backlog, size: int) -> None:
        self.backlog = backlog
        self.size = size
        self.overlap = True
        """Whether to take a batch ahead at all: not for SQLite (`recorder.start`), whose
        INSERTs run on the loop's thread anyway and whose COMMIT, the one part on a worker
        thread, then trades the GIL with the build beside it (docs/performance.md)."""
        self.held: Taken | None = None
        """The batch being written, kept until it is committed."""
        self.ahead: Taken | None = None
        """The batch after it, taken (and built) while it is written."""

    async def take(self, wait: float) -> bool:
        """Hold a batch with its rows built: the one held already (after an outage), the one
        taken ahead, or the next from the backlog (waiting `wait` for it to fill, as
        `Backlog.next_batch` does); False when there is none."""
        if self.held is None:
            batch = await self.backlog.next_batch(self.size, wait)
            if batch is None:
                return False
            self.held = Taken(batch)
        if self.held.rows is None:
            self.held.rows = await self._build(self.held.batch[0], ahead=False)
        return True

    def held_rows(self) -> list[tuple[Pending, Rows]]:
        if self.held is None or self.held.rows is None:
            raise RuntimeError("no batch held, or its rows are not built")
        return self.held.rows

    def look_ahead(self, tasks: asyncio.TaskGroup, closing: bool) -> None:
        """Take and build the next batch in `tasks` while the held one is written: when a whole
        batch is waiting, or none is in memory (the journal may hold more, after the memory
        overflowed or a restart), or the recorder is closing. A part of a batch is left to
        fill meanwhile, as the writer would wait for it."""
        if not self.overlap or self.held is None or self.ahead is not None:
            return
        if closing or not 0 < len(self.backlog) < self.size:
            tasks.create_task(self._take_ahead(self.held.batch[1]))

    async def _take_ahead(self, after: Position | None) -> None:
        try:
            batch = await self.backlog.next_batch(self.size, 0.0, after)
            if batch is not None:
                self.ahead = taken = Taken(batch)
                taken.rows = await self._build(batch[0], ahead=True)
        except Exception:  # the held batch's write goes on; what is not taken is taken later
            log.exception("record writer failed to take the next batch")

    def commit_held(self) -> None:
        """The held batch is in the database: commit the journal up to it."""
        if self.held is not None:
            self.backlog.commit(self.held.batch)
            self.held = None

    def move_on(self) -> None:
        """Hold the batch taken ahead, once the one before it is committed."""
        if self.held is None:
            self.held, self.ahead = self.ahead, None

    def done(self) -> bool:
        """Whether nothing is left to write."""
        return self.held is None and self.ahead is None and self.backlog.done()

    def only_in_memory(self) -> list[Pending]:
        """The records of the taken batches that the journal does not hold (at shutdown)."""
        return [
            record
            for taken in (self.held, self.ahead)
            if taken is not None and taken.batch[1] is None
            for record in taken.batch[0]
        ]

    def pace(self, others: float) -> float:
        """The writer's next stretch between two turns given to the relay, for the records
        waiting now and the relay's turn before (`turns.pace`): the rows it waits for, and the
        SQLite writer's INSERTs."""
        return turns.pace(len(self.backlog), self.size, others)

    def beside_server(self, others: float) -> float:
        """The same for rows built ahead: while the server writes the batch before,
        `turns.beside_server`; once that batch is committed and the writer waits for these
        rows, `pace`, as for the rows of a batch held."""
        if self.held is None:
            return self.pace(others)
        return turns.beside_server(len(self.backlog), self.size, others)

    async def _build(self, batch: list[Pending], ahead: bool) -> list[tuple[Pending, Rows]]:
        """Rows for a batch, built on the event loop's thread between turns given to the relay:
        a worker thread would fight the loop for the GIL (docs/performance.md). A record whose
        rows cannot be built goes to the journal's `.bad`.

        Built while the writer waits for it, its stretches between turns grow with the
        records waiting and the relay's turns (`turns.pace`). Built `ahead`, beside the
        server's work on the batch before, they are also no longer than the loop's other work
        at the turn before (`turns.beside_server`): a long stretch on a loop with nothing else
        to do would hold up that batch's statements and slow the writer down
        (docs/performance.md)."""
        loop_turns = Turns(self.beside_server if ahead else self.pace)
        rows: list[tuple[Pending, Rows]] = []
        for record in batch:
            if isinstance(record, Built):  # built as its journal line was written
                rows.append((record, record.rows))
                continue
            try:
                rows.append((record, rows_for(record)))
            except Exception as exc:
                reason = f"cannot build rows: {exc!r}"
                self.backlog.journal.set_aside(record.id, line_of(record), reason)
            await loop_turns.give()
        await asyncio.sleep(0)  # the relay's turn before the writer's statements start afresh
        return rows
