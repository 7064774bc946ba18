"""The records waiting for the database writer, in the order the writer takes them.

`add()` buffers a record; one write at the end of the event loop's turn appends the buffer to
the journal (records completed together, in one batch of `Deferred`, go in one write), so the
relay never waits on the disk or the database. Journaled records also stay in memory, up to
`queue_size`, so the writer rarely reads the file back. Records the journal refuses (full,
disk full, not writable) are kept in memory only and go first; what does not fit is lost,
counted by `Losses`.

`next_batch()` hands the writer up to `batch_size` records and the journal position they end
at: from memory while the copies are there, else read back from the file (after the memory
overflowed, or after a restart). The writer takes the next batch while the one before is still
being written (`after`: where that one ends), so nothing here commits past what it was told is
in the database: the writer commits each batch, in order, once it is.

A record with a long journal line waits as that line and its rows (`Built`), not as itself:
a response with logprobs parses into thousands of dicts and lists, and while records wait for
a busy writer the cyclic garbage collector scanned them again and again, a third of a
saturated worker's time (docs/performance.md). A record with long bodies is encoded, and its
rows built, as it is added, while it is fresh (when memory has room for it); the others at the
end of the turn, together, which costs plain traffic less. Their rows are built outside the
writer's paced stretches (`store.turns`): in the turn that completes the request.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass

from proxy.exchange import Exchange
from proxy.store.journal import Journal, Position
from proxy.store.lines import encode
from proxy.store.losses import Losses
from proxy.store.rows import Rows, rows_for

log = logging.getLogger(__name__)

BUILT_FROM = 16 * 1024
"""Journal lines this long or longer wait as `Built` (a plain chat exchange's is ~2 KB, one
with 100 logprob tokens ~40 KB); records whose bodies come to this many bytes are encoded as
they are added."""


@dataclass(slots=True)
class Built:
    """A record waiting as its journal line and its rows, built with the line."""

    line: bytes
    rows: Rows

    @property
    def id(self) -> str:
        return self.rows.id


Pending = Exchange | Built
"""A record as it waits for the writer."""
Batch = tuple[list[Pending], Position | None]
"""Records to write and the journal position they end at (None: not journaled)."""


def waiting(record: Pending, line: bytes | None) -> Pending:
    """What a record kept in memory waits as: itself, or, when its line is long, its line and
    its rows (built once). A record without a line (None) waits as itself."""
    if line is None or isinstance(record, Built) or len(line) < BUILT_FROM:
        return record
    try:
        return Built(line, rows_for(record))
    except Exception:  # the writer builds them again, fails the same way and sets it aside
        return record


def line_of(record: Pending) -> bytes:
    """The record's journal line."""
    return record.line if isinstance(record, Built) else encode(record)


def lines_of(records: list[Pending]) -> tuple[list[bytes], list[str]]:
    """The records' journal lines, and the ids of those that have none (a bug, logged when
    they were added)."""
    lines: list[bytes] = []
    missing: list[str] = []
    for record in records:
        try:
            lines.append(line_of(record))
        except Exception:
            missing.append(record.id)
    return lines, missing


Lined = tuple[Pending, bytes | None]
"""A record with its journal line (None: it cannot have one)."""
UNENCODED = "a record's journal line could not be made (a bug, logged)"
"""Why a record is in memory only while the journal is fine."""


def _encoded(exchange: Exchange) -> Lined:
    try:
        return exchange, encode(exchange)
    except Exception:  # a bug must not cost the record: kept in memory for the writer
        log.exception("exchange %s: its journal line failed", exchange.id)
        return exchange, None


class Backlog:
    def __init__(self, journal: Journal, losses: Losses, queue_size: int) -> None:
        self.journal = journal
        self.losses = losses
        self.queue_size = queue_size
        self.arrived = asyncio.Event()
        """Set when records were added; the writer clears it before it waits."""
        self._buffer: list[Exchange | Lined] = []
        """Records for the journal's next write: as they came, or with their line already."""
        self._flush_soon: asyncio.Handle | None = None
        self._fresh: deque[tuple[Position, Position, Pending]] = deque()
        """Journaled records still in memory: (start, end, record), in journal order."""
        self._loose: deque[Pending] = deque()
        """Records the journal refused, kept in memory only."""
        self.journaled = 0
        """Records appended to the journal since start."""
        self._left: Position | None = None
        """Where what an earlier run journaled and did not write ends, until it is written."""
        self.recovered = 0
        """Records an earlier run journaled that this one wrote."""

    def opened(self) -> None:
        """The journal is open: what an earlier run left in it (a crash, a database that did not
        answer before shutdown) is written first, and the log says so, now and once it is."""
        journal = self.journal
        if journal.done < journal.end:
            self._left = journal.end
            log.info(
                "journal %s: records an earlier run did not write (%d bytes) go to the database",
                journal.path,
                journal.total_bytes - journal.done[1],
            )

    def commit(self, batch: Batch) -> None:
        """`batch` is in the database: the journal is committed up to its end."""
        if batch[1] is not None:
            self._commit(batch[1], len(batch[0]))

    def _commit(self, end: Position, records: int) -> None:
        self.journal.commit(end)
        left = self._left
        if left is None:
            return
        if end <= left:
            self.recovered += records
        if end >= left:
            self._left = None
            log.info(
                "recovered %d journaled records from an earlier run: written to the database",
                self.recovered,
            )

    def __len__(self) -> int:
        """Records held in memory for the writer."""
        return len(self._fresh) + len(self._loose)

    def add(self, exchange: Exchange) -> None:
        """Buffer a record for the journal's next write. One with long bodies that memory has
        room for is encoded now, and its rows built, while it is fresh, so that its parsed
        response goes with the request that made it (`waiting`); the others with the turn's
        other records (`flush`)."""
        short = exchange.response_bytes + len(exchange.request_body or b"") < BUILT_FROM
        # Past `queue_size` it is read back from the journal, and its rows are built then.
        if short or len(self) + len(self._buffer) >= self.queue_size:
            self._buffer.append(exchange)
        else:
            record, line = _encoded(exchange)
            self._buffer.append((waiting(record, line), line))
        if self._flush_soon is None:
            self._flush_soon = asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Journal the buffered records in one write; keep them in memory for the writer."""
        if self._flush_soon is not None:
            self._flush_soon.cancel()
            self._flush_soon = None
        if not self._buffer:
            return
        buffered = [b if isinstance(b, tuple) else _encoded(b) for b in self._buffer]
        self._buffer = []
        lined = [(record, line) for record, line in buffered if line is not None]
        ends = self._append([line for _, line in lined])
        if ends is None:
            self._keep_loose(buffered, self.journal.problem)
        else:
            self._keep_loose([(record, None) for record, line in buffered if line is None])
            self._keep_fresh(lined, ends)
        self.losses.report()
        self.arrived.set()

    def _keep_fresh(self, lined: list[tuple[Pending, bytes]], ends: list[Position]) -> None:
        """Keep journaled records in memory for the writer, as far as `queue_size` goes."""
        self.journaled += len(lined)
        room = self.queue_size - len(self)
        for (record, line), end in zip(lined[: max(room, 0)], ends, strict=False):
            self._fresh.append(((end[0], end[1] - len(line)), end, waiting(record, line)))

    def _append(self, lines: list[bytes]) -> list[Position] | None:
        """`Journal.append`; None when it refuses or fails."""
        if not lines:
            return []
        try:
            return self.journal.append(lines)
        except Exception:  # a bug must not cost the records: kept in memory for the writer
            log.exception("journaling %d records failed", len(lines))
            return None

    def _keep_loose(self, records: list[Lined], why: str | None = UNENCODED) -> None:
        """Keep records the journal does not hold in memory, as far as `queue_size` goes."""
        if not records:
            return
        room = self.queue_size - len(self)
        # Memory is for what is nowhere else: journaled copies make way (read back later).
        while self._fresh and room < len(records):
            self._fresh.pop()
            room += 1
        kept = records[:room]
        self._loose.extend(waiting(record, line) for record, line in kept)
        self.losses.kept_in_memory(len(kept), why)
        self.losses.lost([record.id for record, _ in records[room:]], why)

    def only_in_memory(self) -> list[Pending]:
        """The records the journal does not hold, taken out (at shutdown)."""
        loose = list(self._loose)
        self._loose.clear()
        return loose

    def done(self) -> bool:
        """Whether nothing is left to write: none in memory, the journal all committed."""
        return not self._loose and not self._fresh and self.journal.done >= self.journal.end

    async def next_batch(
        self, size: int, wait: float, after: Position | None = None
    ) -> Batch | None:
        """The next batch: records the journal refused first, then the journal in order.
        Waits `wait` seconds first when less than a batch is in memory, to let it fill.

        `after`: where a batch taken before and not committed yet ends; the journal is read
        from there instead of from what is committed. Lines there that are not records are then
        handed back as a batch without records, for the writer to commit in its turn."""
        if wait and 0 < len(self) < size:
            await asyncio.sleep(wait)
        if self._loose:
            return [self._loose.popleft() for _ in range(min(size, len(self._loose)))], None
        journal = self.journal
        at = journal.done if after is None else after
        if journal.limit(at) == at[1] and (following := journal.next_segment(at)):
            if after is None:
                self._commit(following, 0)  # a sealed segment read to its end: delete it
            at = following
        while self._fresh and self._fresh[0][1] <= at:
            self._fresh.popleft()  # read from the file meanwhile
        if self._fresh and self._fresh[0][0] == at:
            batch: list[Pending] = []
            end = at
            while self._fresh and len(batch) < size and self._fresh[0][0] == end:
                _, end, ex = self._fresh.popleft()
                batch.append(ex)
            return batch, end
        return await self._read(at, size, ahead=after is not None)

    async def _read(self, at: Position, size: int, *, ahead: bool) -> Batch | None:
        """The next batch from the journal file, up to the first record still in memory."""
        limit = self.journal.limit(at)
        if self._fresh and self._fresh[0][0][0] == at[0]:
            limit = self._fresh[0][0][1] if limit is None else min(limit, self._fresh[0][0][1])
        if limit is None or limit <= at[1]:
            return None
        f = self.journal.open_segment(at[0])
        # Reading and decoding a batch of big records takes a while: off the event loop.
        found, stop = await asyncio.to_thread(self.journal.read, f, at, limit, size)
        batch: list[Pending] = [ex for ex, _ in found]
        end = (at[0], stop)
        if not batch and not ahead:
            self._commit(end, 0)  # only lines that were not records
            return None
        return batch, end
