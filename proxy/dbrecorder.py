"""The database recorder: a bounded queue, one background writer, a spool for bad times.

`record()` only puts the exchange on an in-memory queue (or, when the queue is full, appends it
to the spool file), so the relay never waits on the database. One writer task takes up to
`batch_size` records, waiting at most `batch_interval` for a batch to fill, and writes each
batch in one transaction. When the database fails, the batch goes to the spool, later batches
go straight to it, and the writer retries with exponential backoff; once the database answers,
the spool is written back a batch at a time between fresh batches. Writes are idempotent by
exchange id (`store.write`), so anything retried or replayed twice is still stored once.

A record the database refuses for its own sake (a constraint, a value it cannot hold) is not an
outage: it is moved to `<spool>.bad` with a warning so it cannot block the records behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Generator

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from .config import Config
from .exchange import Exchange
from .pricing import PriceTable
from .store import check_writable
from .store.engine import SQLITE_BUSY_TIMEOUT_MS, check_connection, create_engine, describe
from .store.migrate import check_head, upgrade
from .store.spool import Spool
from .store.sqlite_writer import SqliteWriter
from .store.write import Rows, rows_for, write_rows
from .turns import Turns

log = logging.getLogger("flightrec.recorder")

_IDLE = 0.5
"""Seconds the idle writer sleeps between looks at the spool and the retry clock."""


class _Outage(Exception):
    """The database cannot take writes right now; carries the one-line reason."""


def _refuses_record(exc: BaseException) -> bool:
    """True when the failure is about the data written, not about the database being there."""
    seen: BaseException | None = exc
    while seen is not None:
        # ValueError: a value the driver cannot encode (a lone surrogate); TypeError: odd types;
        # sqlite3 raises ProgrammingError for a value it cannot bind, OverflowError for an int
        # beyond 64 bits.
        if isinstance(
            seen,
            sa.exc.IntegrityError
            | sa.exc.DataError
            | sqlite3.IntegrityError
            | sqlite3.DataError
            | sqlite3.ProgrammingError
            | sqlite3.InterfaceError
            | OverflowError
            | ValueError
            | TypeError,
        ):
            return True
        seen = seen.__cause__ or (seen.orig if isinstance(seen, sa.exc.DBAPIError) else None)
    # A StatementError that is not a DBAPIError failed while binding parameters: our values.
    return isinstance(exc, sa.exc.StatementError) and not isinstance(exc, sa.exc.DBAPIError)


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
        with contextlib.suppress(sa.exc.ArgumentError):  # start() reports a bad URL
            url = make_url(config.db_url)
            if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
                self._sqlite = SqliteWriter(url.database, busy_timeout_ms)
        # Config was validated at load, so this cannot raise for a Config from `config.load`.
        self._prices = PriceTable.load(config.prices)
        self._queue: asyncio.Queue[Exchange] = asyncio.Queue(config.queue_size)
        self._arrived = asyncio.Event()
        self.spool = Spool(config.spool_path)
        self._task: asyncio.Task[None] | None = None
        self._inflight: list[Exchange] = []
        self._replay: Generator[tuple[list[Exchange], int]] | None = None
        self._healthy = True
        self._retry_at = 0.0
        self._backoff = self.retry_min
        self._closing = False
        # Set by close(): one more try at the database even while backing off.
        self._last_try = False
        self._closed = False

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            self._engine = create_engine(self._config.db_url)
        return self._engine

    async def start(self) -> None:
        """Open the spool (raises `StoreError` if another process holds it) and start writing.

        A spool left by an earlier run is written back as soon as the database answers.
        Idempotent: `open_recorder` starts the recorder, the app's cleanup context may again.
        """
        if self._task is not None:
            return
        self.spool.open()
        self._engine = self.engine  # a malformed URL fails here, not inside the writer
        self._task = asyncio.create_task(self._run(), name="flightrec-writer")

    def record(self, exchange: Exchange) -> None:
        if self._closed:
            self._to_spool([exchange])
            return
        try:
            self._queue.put_nowait(exchange)
        except asyncio.QueueFull:
            self._to_spool([exchange])
            return
        if not self._arrived.is_set():
            self._arrived.set()

    def ready(self) -> bool:
        saturated = self._queue.qsize() > 0.9 * self._config.queue_size
        return self._healthy and not saturated and not self._closing

    async def close(self) -> None:
        """Write out the queue and the spool within `shutdown_grace`; the rest stays spooled."""
        if self._task is None or self._closed:
            return
        self._closing = True
        self._last_try = True
        self._arrived.set()
        _, running = await asyncio.wait({self._task}, timeout=self._config.shutdown_grace)
        if running:
            log.warning(
                "shutdown grace (%ss) over: leaving what is not written yet in %s",
                self._config.shutdown_grace,
                self.spool.path,
            )
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        # A batch cut off mid-transaction may or may not have committed: spooling it again is
        # safe because writes are idempotent.
        self._to_spool(self._inflight + self._take(self._queue.qsize()))
        self._inflight = []
        self._close_replay()
        self._closed = True
        self.spool.close()
        if self._sqlite is not None:
            await self._sqlite.close()
        if self._engine is not None:
            await self._engine.dispose()

    def _to_spool(self, exchanges: list[Exchange]) -> None:
        if not exchanges:
            return
        try:
            self.spool.append(exchanges)
        except Exception as exc:  # never raise into the relay; say exactly what is lost
            log.error(
                "cannot write %d records to the spool %s (%s): lost %s",
                len(exchanges),
                self.spool.path,
                exc,
                ", ".join(ex.id for ex in exchanges),
            )

    def _take(self, limit: int) -> list[Exchange]:
        taken: list[Exchange] = []
        while len(taken) < limit and not self._queue.empty():
            taken.append(self._queue.get_nowait())
        return taken

    async def _wait(self, seconds: float) -> None:
        self._arrived.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._arrived.wait(), seconds)

    async def _next_batch(self) -> list[Exchange]:
        """Up to `batch_size` records. The first record wakes an idle writer; then it sleeps
        once for `batch_interval` while the batch fills. Waking for every record instead
        (a task and a timer each time) cost more CPU than writing the record."""
        size = self._config.batch_size
        if self._queue.empty() and not self._closing and (idle := self._idle_timeout()) > 0:
            await self._wait(idle)
        if not self._closing and 0 < self._queue.qsize() < size:
            await asyncio.sleep(self._config.batch_interval)
        return self._take(size)

    def _idle_timeout(self) -> float:
        if self._database_due() and (self._replay is not None or self.spool.pending()):
            return 0.0  # spool work waiting: get on with it
        if self._healthy:
            return _IDLE
        return max(0.0, min(_IDLE, self._retry_at - asyncio.get_running_loop().time()))

    def _database_due(self) -> bool:
        if self._healthy or self._last_try:
            return True
        return asyncio.get_running_loop().time() >= self._retry_at

    async def _run(self) -> None:
        while True:
            batch = await self._next_batch()
            try:
                if batch:
                    await self._deliver(batch)
                if self._database_due() and (self._replay is not None or self.spool.pending()):
                    await self._replay_one()
                elif not self._healthy and self._database_due():
                    await self._probe()
            except Exception:  # a bug must not stop the writer: keep the records, go on
                log.exception("record writer failed; keeping the batch in the spool")
                self._to_spool(batch)
            if self._closing and self._queue.empty() and not self._spool_writable():
                return

    def _spool_writable(self) -> bool:
        """Whether closing should still wait for the spool: only while the database answers."""
        return self._healthy and (self._replay is not None or self.spool.pending())

    async def _deliver(self, batch: list[Exchange]) -> None:
        if not self._database_due():
            self._to_spool(batch)
            return
        self._inflight = batch
        try:
            await self._write(batch)
        except _Outage as exc:
            self._to_spool(batch)
            self._failed(str(exc))
        finally:
            self._inflight = []

    async def _replay_one(self) -> None:
        """Write back one spool batch; rotates the spool when a new round starts."""
        if self._replay is None:
            if not self.spool.start_replay():
                return
            self._replay = self.spool.batches(self._config.batch_size)
        # Reading and decoding a batch of big records takes a while: off the event loop.
        item = await asyncio.to_thread(next, self._replay, None)
        if item is None:
            self._replay = None
            self.spool.finish()
            log.info("spool %s written back to the database", self.spool.path)
            return
        batch, offset = item
        try:
            if batch:
                await self._write(batch)
        except _Outage as exc:
            self._close_replay()
            self._failed(str(exc))
            return
        self.spool.committed(offset)

    def _close_replay(self) -> None:
        if self._replay is not None:
            # Still running in its thread when close() cancelled the writer: let it be.
            with contextlib.suppress(ValueError):
                self._replay.close()
            self._replay = None

    async def _probe(self) -> None:
        try:
            await check_connection(self.engine)
        except Exception as exc:
            self._failed(str(exc))
        else:
            self._recovered()

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
                self.spool.set_aside(ex, f"cannot build rows: {exc!r}")
            await turns.give()
        return rows

    async def _write(self, batch: list[Exchange]) -> None:
        """Write a batch in one transaction; raises `_Outage` when the database is unavailable."""
        rows = await self._build(batch)
        try:
            await self._transaction([r for _, r in rows])
        except Exception as exc:
            if not _refuses_record(exc):
                raise _Outage(describe(exc)) from exc
            # One record spoils the batch: find it by writing them one by one.
            for ex, row in rows:
                try:
                    await self._transaction([row])
                except Exception as single:
                    if not _refuses_record(single):
                        raise _Outage(describe(single)) from single
                    self.spool.set_aside(ex, describe(single))
        self._recovered()

    async def _transaction(self, rows: list[Rows]) -> None:
        if self._sqlite is not None:
            await self._sqlite.write(rows)
            return
        async with self.engine.begin() as conn:
            await write_rows(conn, rows)

    def _failed(self, reason: str) -> None:
        if self._healthy:
            log.warning(
                "database unavailable (%s): spooling records to %s", reason, self.spool.path
            )
        self._healthy = False
        self._last_try = False
        self._retry_at = asyncio.get_running_loop().time() + self._backoff
        self._backoff = min(self._backoff * 2, self.retry_max)

    def _recovered(self) -> None:
        if not self._healthy:
            log.info("database available again: writing back %s", self.spool.path)
        self._healthy = True
        self._backoff = self.retry_min


async def open_recorder(config: Config) -> DatabaseRecorder:
    """A started recorder for `config.db_url`, for `serve`.

    Upgrades the schema to head when `config.auto_upgrade` (else checks it is at head), checks
    the database answers, opens the spool and starts the writer. Raises `StoreError` with one
    line when any of that fails; nothing is left running then.
    """
    await check_writable(config.db_url)
    if config.auto_upgrade:
        await upgrade(config.db_url)
    engine = create_engine(config.db_url)
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
