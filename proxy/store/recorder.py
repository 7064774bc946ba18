"""The database recorder: every exchange journaled on arrival, one background writer.

`record()` hands the exchange to the backlog (`store.backlog`), which journals it
(`store.journal`) at the end of the event loop's turn, before and independent of the
database; so the relay never waits on the database, and a crash, a stalled database or an
expired shutdown grace loses nothing journaled.

One writer task works through the backlog in order. It takes up to `batch_size` records,
waiting once for `batch_interval` while a batch fills, builds their rows (`store.rows`),
writes them in one transaction (`store.writer`), then marks the journal committed up to them.
On PostgreSQL, while the server works on a batch, the writer takes the next one and builds its
rows (`store.lookahead`), so the process's work and the server's overlap instead of adding up.
The writer's work on the loop's thread runs in short stretches between the relay's turns, each
longer the further behind it is, and far behind a part of the loop that grows with the relay's
turns (`turns.pace`; rows built beside PostgreSQL's work on the batch before, no longer than
the loop's other work at the turn before: `turns.beside_server`): a busy worker records as it
serves.
A batch that fails for an outage is kept, with the one taken after it, and both are tried again
in order with exponential backoff. Writes are idempotent by exchange id, so what is written
twice is stored once.

When the journal refuses a record (full, disk full, not writable) the record is kept in memory
only, up to `queue_size`, and still written to the database; what does not fit is lost. Both
are counted and named in at most one warning a second, and `readiness()` says why.

`serve` starts even while a PostgreSQL server does not answer (`open_recorder`): records are
journaled from the first request, and the writer checks (or upgrades) the schema once the
database answers, then writes what waited.

A record the database refuses for its own sake (a constraint, a value it cannot hold) is not an
outage: it is moved to `<spool_path>.bad` with a warning so it cannot block the records behind
it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.config import Config
from proxy.exchange import Exchange
from proxy.store import check_writable
from proxy.store.backlog import Backlog, Pending, line_of, lines_of
from proxy.store.engine import (
    SQLITE_BUSY_TIMEOUT_MS,
    StoreError,
    Unreachable,
    create_engine,
    describe,
)
from proxy.store.journal import Journal
from proxy.store.lookahead import Batches
from proxy.store.losses import Losses
from proxy.store.migrate import prepare
from proxy.store.refused import refuses_record
from proxy.store.rows import Rows
from proxy.store.writer import Writer, writer_for

log = logging.getLogger(__name__)
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


class DatabaseRecorder:
    """Implements `proxy.sinks.fanout.Recorder` on SQLite or PostgreSQL."""

    retry_min = 0.2
    retry_max = 5.0

    def __init__(
        self,
        config: Config,
        *,
        engine: AsyncEngine | None = None,
        busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS,
        unprepared: str | None = None,
    ) -> None:
        """`unprepared`: why the database's schema could not be checked yet (it did not
        answer); the writer checks it, or upgrades it, before its first write."""
        self._config = config
        self._engine = engine
        self._busy_timeout_ms = busy_timeout_ms
        self._writer: Writer | None = None
        # Config was validated at load, so this cannot raise for a Config from `config.load`.
        self.journal = Journal(config.spool_path, config.journal_max_bytes)
        self.losses = Losses(self.journal)
        self.backlog = Backlog(self.journal, self.losses, config.queue_size)
        self._batches = Batches(self.backlog, config.batch_size)
        self._task: asyncio.Task[None] | None = None
        self._prepared = unprepared is None
        self._healthy = unprepared is None
        self.written = 0
        """Exchanges this recorder stored (ids found stored already do not count)."""
        self._reason = unprepared or ""
        self._retry_at = 0.0
        self._backoff = self.retry_min
        self._writing_since: float | None = None
        self._stall_said = False
        """Whether the current write was logged as stalled."""
        self._closing = False
        self._last_try = False
        """Set by close(): one more try at the database even while backing off."""
        self._closed = False

    @property
    def journaled(self) -> int:
        """Records appended to the journal since start (read by metrics)."""
        return self.backlog.journaled

    def queue_depth(self) -> int:
        """Records held in memory for the writer."""
        return len(self.backlog)

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
        """Open the journal (raises `StoreError` if another process holds it) and start writing;
        what an earlier run journaled and did not commit is written once the database answers.
        Idempotent: `open_recorder` starts the recorder, the app's cleanup context may again."""
        if self._task is not None:
            return
        self.journal.open()
        self.backlog.opened()
        if self.journal.problem:
            log.warning("%s: records are kept in memory only until it is", self.journal.problem)
        self._engine = self.engine  # a malformed URL fails here, not inside the writer
        self._writer = writer_for(self._engine, self._busy_timeout_ms, self._batches.pace)
        self._batches.overlap = self._engine.dialect.name == "postgresql"
        self._task = asyncio.create_task(self._run(), name="flightrec-writer")

    def accept(self, exchange: Exchange) -> None:
        if self._closed:
            self._keep_after_close([exchange])
            return
        self.backlog.add(exchange)

    def readiness(self) -> str | None:
        """None while records reach the database without piling up; else why not."""
        return self.safety() or self.database_state()

    def safety(self) -> str | None:
        """None while records are kept safe, the journal taking them; else why not."""
        if self._closing:
            return "shutting down"
        if self.journal.problem:
            return f"{self.journal.problem}: records are kept in memory only"
        return None

    def database_state(self) -> str | None:
        """None while the database takes records as they come; else why not."""
        if not self._healthy:
            return f"database unavailable: {self._reason}"
        if self._writing_since is not None:
            waited = asyncio.get_running_loop().time() - self._writing_since
            if waited > STALLED_AFTER:
                return f"database stalled: a write has waited {waited:.0f}s"
        if len(self.backlog) > 0.9 * self._config.queue_size:
            return "queue saturated: the database writer is behind"
        return None

    async def stop(self) -> None:
        """Write out what is held within `shutdown_grace`; what is journaled and not written
        yet is written by the next start."""
        if self._task is None or self._closed:
            return
        self.backlog.flush()
        self._closing = True
        self._last_try = True
        self.backlog.arrived.set()
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
        self.backlog.flush()
        self.losses.report(force=True)
        loose = self.backlog.only_in_memory() + self._batches.only_in_memory()
        self.journal.close()
        self._keep_after_close(loose)
        if self._writer is not None:
            await self._writer.close()
        if self._engine is not None:
            await self._engine.dispose()

    def _keep_after_close(self, records: list[Pending]) -> None:
        """The journal is the only place left (the next start reads it): whatever it refuses
        now is lost, and so is a record without a journal line."""
        lines, lost = lines_of(records)
        if lines and not self.journal.append_closed(lines):
            lost = [record.id for record in records]
        if lost:
            self.losses.lost(lost)
            self.losses.report(force=True)

    # The writer.

    async def _run(self) -> None:
        while not self._finished():
            self.losses.report()
            self.journal.probe()
            loop = asyncio.get_running_loop()
            if not self._healthy and not self._last_try and loop.time() < self._retry_at:
                await asyncio.sleep(max(_FLOOR, self._retry_at - loop.time()))
                continue
            if not self._prepared:
                await self._prepare()
                continue
            try:
                wait = 0.0 if self._closing else self._config.batch_interval
                if not await self._batches.take(wait):
                    await self._idle()
                    continue
                await self._step()
            except Exception:  # a bug must not stop the writer: keep the batch, go on
                log.exception("record writer failed; keeping the batch")
                self._failed("the writer failed")

    def _finished(self) -> bool:
        if not self._closing:
            return False
        if not self._healthy and not self._last_try:
            return True  # the database is down: what is journaled waits for the next start
        return self._batches.done()

    async def _idle(self) -> None:
        self.backlog.arrived.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.backlog.arrived.wait(), _IDLE)

    async def _prepare(self) -> None:
        """Check or upgrade the schema of a database that did not answer at start (not
        time-boxed: an upgrade may take long; each statement has its timeout)."""
        try:
            await prepare(self.engine, self._config.db_url, self._config.auto_upgrade)
        except Exception as exc:  # still unreachable, the schema not at head, a failed upgrade
            reason = str(exc) if isinstance(exc, StoreError) else describe(exc)
            if reason != self._reason:
                log.warning("database not ready: %s", reason)
            self._failed(reason)
        else:
            self._prepared = True
            self._recovered()

    async def _step(self) -> None:
        """Write the held batch while the next is taken and built; once it is in the database,
        commit the journal up to it and hold the next."""
        batches = self._batches
        async with asyncio.TaskGroup() as tasks:
            batches.look_ahead(tasks, self._closing)
            rows = batches.held_rows()
            if rows and not await self._deliver(rows):
                return  # kept, and the batch after it: both are written after the backoff
            batches.commit_held()
        batches.move_on()

    async def _deliver(self, rows: list[tuple[Pending, Rows]]) -> bool:
        """Write a batch; False when the database is unavailable (the batch is kept)."""
        loop = asyncio.get_running_loop()
        self._writing_since = loop.time()
        stall = loop.call_later(STALLED_AFTER, self._stalled)
        try:
            async with asyncio.timeout(WRITE_TIMEOUT):
                await self._write(rows)
        except _Outage as exc:
            self._failed(str(exc))
            return False
        except TimeoutError:
            self._failed(f"database stalled: a write took over {WRITE_TIMEOUT:.0f}s")
            return False
        finally:
            stall.cancel()
            self._writing_since = None
        self._recovered()
        return True

    def _stalled(self) -> None:
        """Say once what `readiness()` says from now on, unless an outage was said already."""
        if self._healthy:
            self._stall_said = True
            log.warning("database stalled: a write has waited %.0fs", STALLED_AFTER)

    async def _write(self, rows: list[tuple[Pending, Rows]]) -> None:
        """Write a batch in one transaction; raises `_Outage` when the database is unavailable."""
        try:
            await self._transaction([r for _, r in rows])
        except Exception as exc:
            if not refuses_record(exc):
                raise _Outage(describe(exc)) from exc
            # One record spoils the batch: find it by writing them one by one.
            for record, row in rows:
                try:
                    await self._transaction([row])
                except Exception as single:
                    if not refuses_record(single):
                        raise _Outage(describe(single)) from single
                    self.journal.set_aside(row.id, line_of(record), describe(single))

    async def _transaction(self, rows: list[Rows]) -> None:
        if self._writer is None:
            raise RuntimeError("the recorder writes only once started")
        self.written += await self._writer.write(rows)

    def _failed(self, reason: str) -> None:
        if self._healthy:
            log.warning("database unavailable (%s): records wait until it answers", reason)
        self._stall_said = False  # the outage's recovery is said instead
        self._healthy = False
        self._reason = reason
        self._last_try = False
        self._retry_at = asyncio.get_running_loop().time() + self._backoff
        self._backoff = min(self._backoff * 2, self.retry_max)

    def _recovered(self) -> None:
        if not self._healthy:
            log.info("database available again: writing the records that waited")
        elif self._stall_said:
            log.info("database answers again after a stall")
        self._stall_said = False
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


async def open_recorder(config: Config, *, wait_for_database: bool = False) -> DatabaseRecorder:
    """A started recorder for `config.db_url`.

    Upgrades the schema to head when `config.auto_upgrade` (else checks it is at head), checks
    the database answers, opens the journal and starts the writer. Raises `StoreError` with one
    line when any of that fails; nothing is left running then. With `wait_for_database` (for
    `serve`), a PostgreSQL server that does not answer is not a failure: the recorder starts
    unready, journals what it is given, and prepares the database once it answers.
    """
    await check_writable(config.db_url)
    engine = recorder_engine(config.db_url)
    try:
        try:
            await prepare(engine, config.db_url, config.auto_upgrade)
            unprepared = None
        except Unreachable as exc:
            if not wait_for_database or engine.dialect.name == "sqlite":
                raise
            log.warning("%s: serving; records are journaled until it answers", exc)
            unprepared = str(exc)
        recorder = DatabaseRecorder(config, engine=engine, unprepared=unprepared)
        await recorder.start()
    except BaseException:
        await engine.dispose()
        raise
    return recorder
