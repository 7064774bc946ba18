"""The database recorder: every exchange journaled on arrival, one background writer.

`record()` puts the exchange in a short buffer that goes to the journal (`store.journal`) with
one write a millisecond later, before and independent of the database; so the relay never
waits on the database, and a crash, a stalled database or an expired shutdown grace loses
nothing journaled. Journaled records also stay in memory, up to `queue_size`, for the writer.

One writer task works through the journal in order: from the in-memory copies while they are
there (the usual case), from the file when they are not (after the queue overflowed, or after a
restart). It takes up to `batch_size` records, waiting once for `batch_interval` while a batch
fills, writes the batch in one transaction, then marks the journal committed up to it. A batch
that fails for an outage is kept and tried again with exponential backoff. Writes are
idempotent by exchange id (`store.write`), so what is written twice is stored once.

When the journal refuses a record (full, disk full, not writable) the record is kept in memory
only, up to `queue_size`, and still written to the database; what does not fit is lost. Both
are counted and named in at most one warning a second, and `readiness()` says why.

A record the database refuses for its own sake (a constraint, a value it cannot hold) is not an
outage: it is moved to `<spool_path>.bad` with a warning so it cannot block the records behind
it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from .config import Config
from .exchange import Exchange
from .pricing import PriceTable
from .store import check_writable
from .store.engine import SQLITE_BUSY_TIMEOUT_MS, check_connection, create_engine, describe
from .store.journal import Journal, Position
from .store.lines import encode
from .store.losses import Losses
from .store.migrate import check_head, upgrade
from .store.refused import refuses_record
from .store.sqlite_writer import SqliteWriter
from .store.write import Rows, rows_for, write_rows
from .turns import Turns

log = logging.getLogger("flightrec.recorder")

JOURNAL_DELAY = 0.001
"""Seconds records wait to be journaled together in one write."""
PG_WRITE_COMMAND_TIMEOUT = 5.0
"""Seconds a PostgreSQL statement of the writer may take: a stalled server (connection open,
no bytes) counts as an outage this soon. The CLI's engine keeps the longer default."""
WRITE_TIMEOUT = 30.0
"""Seconds a batch may take in all before the writer gives up on it and tries again."""
STALLED_AFTER = 2.0
"""Seconds a write may take before `readiness()` calls the database stalled."""
_IDLE = 0.5
"""Seconds the idle writer waits for records before it looks again."""
_FLOOR = 0.01
"""Seconds: the least the writer waits before it tries again after anything failed."""


class _Outage(Exception):
    """The database cannot take writes right now; carries the one-line reason."""


Batch = tuple[list[Exchange], Position | None]
"""Records to write and the journal position they end at (None: not journaled)."""


class DatabaseRecorder:
    """Implements `proxy.recorder.Recorder` on SQLite or PostgreSQL."""

    retry_min = 0.2
    retry_max = 5.0

    def __init__(
        self,
        config: Config,
        *,
        engine: AsyncEngine | None = None,
        busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS,
    ) -> None:
        self._config = config
        self._engine = engine
        self._sqlite: SqliteWriter | None = None
        with contextlib.suppress(Exception):  # start() reports a bad URL
            url = make_url(config.db_url)
            if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
                self._sqlite = SqliteWriter(url.database, busy_timeout_ms)
        # Config was validated at load, so this cannot raise for a Config from `config.load`.
        self._prices = PriceTable.load(config.prices)
        self.journal = Journal(config.spool_path, config.journal_max_bytes)
        self.losses = Losses(self.journal)
        self._buffer: list[Exchange] = []
        self._timer: asyncio.TimerHandle | None = None
        self._fresh: deque[tuple[Position, Position, Exchange]] = deque()
        """Journaled records still in memory: (start, end, exchange), in journal order."""
        self._loose: deque[Exchange] = deque()
        """Records the journal refused, kept in memory only."""
        self._held: Batch | None = None
        """The batch being written, kept until it is committed."""
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._healthy = True
        self._reason = ""
        self._retry_at = 0.0
        self._backoff = self.retry_min
        self._writing_since: float | None = None
        self._closing = False
        self._last_try = False
        """Set by close(): one more try at the database even while backing off."""
        self._closed = False
        self.written = 0
        """Records written to the database since start (read by metrics)."""
        self.journaled = 0
        """Records appended to the journal since start (read by metrics)."""

    def queue_depth(self) -> int:
        """Records held in memory for the writer."""
        return len(self._buffer) + len(self._fresh) + len(self._loose)

    def journal_bytes(self) -> int:
        return self.journal.total_bytes

    def database_up(self) -> bool:
        """False from a failed write until the next one succeeds."""
        return self._healthy

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            self._engine = recorder_engine(self._config.db_url)
        return self._engine

    async def start(self) -> None:
        """Open the journal (raises `StoreError` if another process holds it) and start writing.

        What an earlier run journaled and did not commit is written as soon as the database
        answers. Idempotent: `open_recorder` starts the recorder, the app's cleanup context may
        again.
        """
        if self._task is not None:
            return
        self.journal.open()
        if self.journal.problem:
            log.warning("%s: records are kept in memory only until it is", self.journal.problem)
        self._engine = self.engine  # a malformed URL fails here, not inside the writer
        self._task = asyncio.create_task(self._run(), name="flightrec-writer")

    def record(self, exchange: Exchange) -> None:
        if self._closed:
            self._keep_after_close([exchange])
            return
        self._buffer.append(exchange)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(JOURNAL_DELAY, self._flush)

    def readiness(self) -> str | None:
        """None while records reach the database without piling up; else why not."""
        if self._closing:
            return "shutting down"
        if self.journal.problem:
            return f"{self.journal.problem}: records are kept in memory only"
        if not self._healthy:
            return f"database unavailable: {self._reason}"
        if self._writing_since is not None:
            waited = asyncio.get_running_loop().time() - self._writing_since
            if waited > STALLED_AFTER:
                return f"database stalled: a write has waited {waited:.0f}s"
        if len(self._fresh) + len(self._loose) > 0.9 * self._config.queue_size:
            return "queue saturated: the database writer is behind"
        return None

    def ready(self) -> bool:
        return self.readiness() is None

    async def close(self) -> None:
        """Write out what is held within `shutdown_grace`; what is journaled and not written
        yet is written by the next start."""
        if self._task is None or self._closed:
            return
        self._flush()
        self._closing = True
        self._last_try = True
        self._wake.set()
        _, running = await asyncio.wait({self._task}, timeout=self._config.shutdown_grace)
        if running:
            log.warning(
                "shutdown grace (%ss) over: the next start writes what is left in %s",
                self._config.shutdown_grace,
                self.journal.path,
            )
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._closed = True
        self._flush()
        self.losses.report(force=True)
        loose = list(self._loose)
        if self._held is not None and self._held[1] is None:
            loose += self._held[0]
        self.journal.close()
        self._keep_after_close(loose)
        if self._sqlite is not None:
            await self._sqlite.close()
        if self._engine is not None:
            await self._engine.dispose()

    def _keep_after_close(self, exchanges: list[Exchange]) -> None:
        """The journal is the only place left (the next start reads it): whatever it refuses
        now is lost."""
        if exchanges and not self.journal.append_closed([encode(ex) for ex in exchanges]):
            self.losses.lost(exchanges)
            self.losses.report(force=True)

    def _flush(self) -> None:
        """Journal the buffered records in one write; keep them in memory for the writer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._buffer:
            return
        buffered, self._buffer = self._buffer, []
        try:
            lines = [encode(ex) for ex in buffered]
            ends = self.journal.append(lines)
        except Exception:  # a bug must not cost the records: keep them for the writer
            log.exception("journaling %d records failed", len(buffered))
            lines, ends = [], None
        room = self._config.queue_size - len(self._fresh) - len(self._loose)
        if ends is None:
            # Memory is for what is nowhere else: journaled copies make way (read back later).
            while self._fresh and room < len(buffered):
                self._fresh.pop()
                room += 1
            self._loose.extend(buffered[:room])
            self.losses.kept_in_memory(buffered[:room])
            self.losses.lost(buffered[room:])
        else:
            self.journaled += len(buffered)
            for ex, line, end in zip(buffered[: max(room, 0)], lines, ends, strict=False):
                self._fresh.append(((end[0], end[1] - len(line)), end, ex))
        self.losses.report()
        self._wake.set()

    # The writer.

    async def _run(self) -> None:
        while not self._finished():
            self.losses.report()
            loop = asyncio.get_running_loop()
            if not self._healthy and not self._last_try and loop.time() < self._retry_at:
                await asyncio.sleep(max(_FLOOR, self._retry_at - loop.time()))
                continue
            try:
                batch = self._held or await self._next_batch()
                if batch is None:
                    await self._idle()
                    continue
                self._held = batch
                if await self._deliver(batch[0]):
                    self._held = None
                    if batch[1] is not None:
                        self.journal.commit(batch[1])
            except Exception:  # a bug must not stop the writer: keep the batch, go on
                log.exception("record writer failed; keeping the batch")
                self._failed("the writer failed")

    def _finished(self) -> bool:
        if not self._closing:
            return False
        if not self._healthy and not self._last_try:
            return True  # the database is down: what is journaled waits for the next start
        return self._held is None and not self._loose and not self._fresh and not self._behind()

    def _behind(self) -> bool:
        """Whether the journal holds records not committed yet."""
        return self.journal.done < self.journal.end

    async def _idle(self) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), _IDLE)

    async def _next_batch(self) -> Batch | None:
        """The next batch: records the journal refused first, then the journal in order."""
        size = self._config.batch_size
        if (
            not self._closing
            and len(self._loose) + len(self._fresh) < size
            and (self._loose or self._fresh)
        ):
            await asyncio.sleep(self._config.batch_interval)  # let the batch fill
        if self._loose:
            return [self._loose.popleft() for _ in range(min(size, len(self._loose)))], None
        journal = self.journal
        done = journal.done
        if journal.limit(done) == done[1] and (following := journal.next_segment(done)):
            journal.commit(following)  # a sealed segment read to its end: delete it
            done = following
        while self._fresh and self._fresh[0][1] <= done:
            self._fresh.popleft()  # read from the file meanwhile
        if self._fresh and self._fresh[0][0] == done:
            batch: list[Exchange] = []
            end = done
            while self._fresh and len(batch) < size and self._fresh[0][0] == end:
                _, end, ex = self._fresh.popleft()
                batch.append(ex)
            return batch, end
        return await self._read(done, size)

    async def _read(self, done: Position, size: int) -> Batch | None:
        """The next batch from the journal file, up to the first record still in memory."""
        limit = self.journal.limit(done)
        if self._fresh and self._fresh[0][0][0] == done[0]:
            limit = self._fresh[0][0][1] if limit is None else min(limit, self._fresh[0][0][1])
        if limit is None or limit <= done[1]:
            return None
        f = self.journal.open_segment(done[0])
        # Reading and decoding a batch of big records takes a while: off the event loop.
        found, stop = await asyncio.to_thread(self.journal.read, f, done, limit, size)
        batch = [ex for ex, _ in found]
        end = (done[0], stop)
        if not batch:
            self.journal.commit(end)  # only lines that were not records
            return None
        return batch, end

    async def _deliver(self, batch: list[Exchange]) -> bool:
        """Write a batch; False when the database is unavailable (the batch is kept)."""
        loop = asyncio.get_running_loop()
        self._writing_since = loop.time()
        try:
            async with asyncio.timeout(WRITE_TIMEOUT):
                await self._write(batch)
        except _Outage as exc:
            self._failed(str(exc))
            return False
        except TimeoutError:
            self._failed(f"database stalled: a write took over {WRITE_TIMEOUT:.0f}s")
            return False
        finally:
            self._writing_since = None
        self._recovered()
        return True

    async def _build(self, batch: list[Exchange]) -> list[tuple[Exchange, Rows]]:
        """Rows for a batch, built on the event loop's thread, giving the relay a turn every
        `turns.WORK_BUDGET`. A worker thread would fight the loop for the GIL, which cost more
        CPU per record than building the rows (bench/)."""
        turns = Turns()
        rows: list[tuple[Exchange, Rows]] = []
        for ex in batch:
            try:
                rows.append((ex, rows_for(ex, self._prices)))
            except Exception as exc:
                self.journal.set_aside(ex, f"cannot build rows: {exc!r}")
            await turns.give()
        return rows

    async def _write(self, batch: list[Exchange]) -> None:
        """Write a batch in one transaction; raises `_Outage` when the database is unavailable."""
        rows = await self._build(batch)
        try:
            await self._transaction([r for _, r in rows])
            self.written += len(rows)
        except Exception as exc:
            if not refuses_record(exc):
                raise _Outage(describe(exc)) from exc
            # One record spoils the batch: find it by writing them one by one.
            for ex, row in rows:
                try:
                    await self._transaction([row])
                    self.written += 1
                except Exception as single:
                    if not refuses_record(single):
                        raise _Outage(describe(single)) from single
                    self.journal.set_aside(ex, describe(single))

    async def _transaction(self, rows: list[Rows]) -> None:
        if self._sqlite is not None:
            await self._sqlite.write(rows)
            return
        async with self.engine.begin() as conn:
            await write_rows(conn, rows)

    def _failed(self, reason: str) -> None:
        if self._healthy:
            log.warning("database unavailable (%s): records wait until it answers", reason)
        self._healthy = False
        self._reason = reason
        self._last_try = False
        self._retry_at = asyncio.get_running_loop().time() + self._backoff
        self._backoff = min(self._backoff * 2, self.retry_max)

    def _recovered(self) -> None:
        if not self._healthy:
            log.info("database available again: writing the records that waited")
        self._healthy = True
        self._backoff = self.retry_min


def recorder_engine(url: str) -> AsyncEngine:
    """An engine for the writer: PostgreSQL statements time out after
    `PG_WRITE_COMMAND_TIMEOUT`, so a stalled server is an outage within seconds."""
    engine = create_engine(url)
    if engine.dialect.name == "postgresql":

        @event.listens_for(engine.sync_engine, "do_connect")
        def shorter_timeout(dialect: Any, conn_rec: Any, cargs: Any, cparams: Any) -> None:
            cparams["command_timeout"] = PG_WRITE_COMMAND_TIMEOUT

    return engine


async def open_recorder(config: Config) -> DatabaseRecorder:
    """A started recorder for `config.db_url`, for `serve`.

    Upgrades the schema to head when `config.auto_upgrade` (else checks it is at head), checks
    the database answers, opens the journal and starts the writer. Raises `StoreError` with one
    line when any of that fails; nothing is left running then.
    """
    await check_writable(config.db_url)
    if config.auto_upgrade:
        await upgrade(config.db_url)
    engine = recorder_engine(config.db_url)
    try:
        await check_connection(engine)
        if not config.auto_upgrade:
            await check_head(engine)
        recorder = DatabaseRecorder(config, engine=engine)
        await recorder.start()
    except BaseException:
        await engine.dispose()
        raise
    return recorder
