"""Async engines for SQLite and PostgreSQL, and the one error type the store raises.

SQLite gets WAL (readers never block the writer), `synchronous=NORMAL` (durable across process
crashes, fsync only at checkpoints) and a busy timeout so concurrent CLI readers and the proxy
wait instead of failing. PostgreSQL gets a small pool with pre-ping, so the first write after an
outage finds out about dead connections instead of failing the batch, and short connect and
command timeouts, so an outage is noticed in seconds rather than asyncpg's default minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sqlite3
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from proxy.text import dumps as dumps  # the JSON columns' text, for the store's modules

SQLITE_BUSY_TIMEOUT_MS = 5_000
SQLITE_PAGE_SIZE = 16_384
"""Bytes per page of a new SQLite database (SQLite's default is 4,096): records carry whole
bodies, and fewer, larger pages cut the system calls of commits and checkpoints
(docs/performance.md). An existing database keeps its page size."""
PG_CONNECT_TIMEOUT = 5.0
PG_COMMAND_TIMEOUT = 60.0


class StoreError(Exception):
    """The database cannot be used: unreachable, wrong schema, unknown record. One line."""


class Unreachable(StoreError):
    """The database server did not answer (refused, name not found, timed out, starting up):
    unlike a wrong password, a missing database or a TLS failure, it may answer later."""


_ABSENT = (
    ConnectionRefusedError,
    ConnectionResetError,
    ConnectionAbortedError,
    BrokenPipeError,
    TimeoutError,
    FileNotFoundError,  # a Unix socket the server has not made yet
    socket.gaierror,  # a host name not in DNS yet (a container starting beside this one)
)
"""A server that is not there, or not yet. Other OSErrors (TLS among them) are refusals."""
_SQLSTATES_LATER = ("08", "57P01", "57P02", "57P03")
"""PostgreSQL: connection exceptions; shutting down, crashed, starting up."""
_SQLITE_LATER = (
    "database is locked",
    "database table is locked",
    "unable to open database file",
    "disk i/o error",
)
"""SQLite: locked past the busy timeout, or its file out of reach for now."""


def safe_url(url: str) -> str:
    """The URL with any password masked, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<unparsable database URL>"


def create_engine(url: str, *, busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS) -> AsyncEngine:
    """An engine for `url` (no connection is made yet)."""
    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError:
        raise StoreError(f"not a database URL: {safe_url(url)}") from None
    backend = parsed.get_backend_name()
    if parsed.drivername == "sqlite+aiosqlite":
        engine = create_async_engine(parsed, json_serializer=dumps, json_deserializer=orjson.loads)
        _sqlite_pragmas(engine, busy_timeout_ms, sqlite_file(parsed.database))
        return engine
    if parsed.drivername == "postgresql+asyncpg":
        return create_async_engine(
            parsed,
            json_serializer=dumps,
            json_deserializer=orjson.loads,
            pool_size=5,
            max_overflow=5,
            pool_pre_ping=True,
            connect_args={
                "timeout": PG_CONNECT_TIMEOUT,
                "command_timeout": PG_COMMAND_TIMEOUT,
                "server_settings": {"application_name": "flightrec"},
            },
        )
    raise StoreError(
        f"unsupported database {backend!r} in {safe_url(url)}: "
        "use sqlite+aiosqlite:// or postgresql+asyncpg://"
    )


def sqlite_file(database: str | None) -> str | None:
    """The file a SQLite URL's database names; None for memory and `file:` URIs."""
    if database in (None, "", ":memory:") or database.startswith("file:"):
        return None
    return database


def create_private(path: str) -> None:
    """Create the SQLite file at `path`, readable by its owner only, unless it exists.

    Records hold whole prompts and answers. SQLite gives the -wal and -shm files it creates
    the database file's mode, so this one file decides all three.
    """
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


def _sqlite_pragmas(engine: AsyncEngine, busy_timeout_ms: int, path: str | None) -> None:
    if path is not None:
        # Before the driver connects: it would create a missing file with the umask's mode.
        event.listen(engine.sync_engine, "do_connect", lambda *_: create_private(path))

    @event.listens_for(engine.sync_engine, "connect")
    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        sqlite_pragmas(dbapi_connection, busy_timeout_ms=busy_timeout_ms)


def sqlite_pragmas(con: Any, *, busy_timeout_ms: int) -> None:
    """The settings every flightrec connection to a SQLite file runs with (the engine's and
    the recorder's writer's): WAL, `synchronous=NORMAL`, new files with larger pages."""
    cursor = con.cursor()
    try:
        # busy_timeout first: switching to WAL itself needs the lock another process may hold.
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        cursor.execute("PRAGMA journal_mode")
        if cursor.fetchone()[0].lower() != "wal":
            # A no-op unless the file is still empty; must come before WAL, which fixes it.
            cursor.execute(f"PRAGMA page_size = {SQLITE_PAGE_SIZE}")
            cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
    finally:
        cursor.close()


def describe(exc: BaseException) -> str:
    """One line naming what went wrong, from the innermost cause (the driver's own error)."""
    inner = _innermost(exc)
    lines = str(inner).strip().splitlines()
    return f"{type(inner).__name__}: {lines[0]}" if lines else type(inner).__name__


async def check_connection(engine: AsyncEngine) -> None:
    """Raise `StoreError` unless the database answers a trivial query."""
    try:
        async with engine.connect() as conn:
            await conn.execute(sa.text("SELECT 1"))
    except Exception as exc:
        # Drivers raise their own types here (OSError, asyncpg's, sqlite3's, timeouts): all of
        # them mean the same thing to the user.
        where = engine.url.render_as_string(hide_password=True)
        error = Unreachable if gone(exc) else StoreError
        raise error(f"cannot connect to the database at {where}: {describe(exc)}") from None


def gone(exc: BaseException) -> bool:
    """Whether `exc`, raised connecting or by a query, says the database cannot be used now
    but may be later (down, unreachable, the connection lost, SQLite locked past the busy
    timeout), not that the query, the data, the credentials or TLS are wrong."""
    inner = _innermost(exc)
    if isinstance(inner, _ABSENT):
        return True
    if isinstance(inner, sqlite3.OperationalError):
        return str(inner).lower().startswith(_SQLITE_LATER)
    return str(getattr(inner, "sqlstate", None) or "").startswith(_SQLSTATES_LATER)


def _innermost(exc: BaseException) -> BaseException:
    """The driver's own error behind SQLAlchemy's, or the first cause of a chain."""
    inner: BaseException = exc
    if isinstance(exc, sa.exc.DBAPIError) and exc.orig is not None:
        inner = exc.orig
    while inner.__cause__ is not None:
        inner = inner.__cause__
    return inner


async def check_writable(url: str, *, busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS) -> None:
    """Raise `StoreError` unless the SQLite database file of `url` can be written (other
    databases: nothing to check here).

    SQLite opens a file it may not write read-only without a word, and a database whose
    directory is read-only cannot get its -wal file: either fails only at the first write, so
    `serve` checks before it takes traffic.
    """
    path = sqlite_file(make_url(url).database) if url.startswith("sqlite") else None
    if path is None:
        return
    try:
        await asyncio.to_thread(_try_a_write, path, busy_timeout_ms / 1000)
    except (sqlite3.OperationalError, OSError) as exc:
        if "locked" in str(exc):
            return  # another process is writing: the file is writable
        raise StoreError(
            f"cannot write the SQLite database {path} ({describe(exc)}): the file and its "
            "directory must be writable by the user flightrec runs as"
        ) from None
    except sqlite3.Error:
        return  # not about writing (e.g. not a database): the connection check names it


def _try_a_write(path: str, busy_timeout: float) -> None:
    create_private(path)
    with contextlib.closing(sqlite3.connect(path, busy_timeout, isolation_level=None)) as con:
        con.execute("BEGIN IMMEDIATE")
        try:
            con.execute("CREATE TABLE flightrec_write_check (x)")  # rolled back: leaves nothing
        finally:
            con.execute("ROLLBACK")
