"""The spool: an append-only file of records the database could not take yet.

One JSON line per exchange, `{"v": 1, "exchange": {...}}`, holding exactly what the database
would store (omitted bodies are already gone; raw bodies base64). Lines are appended with one
`os.write` on an O_APPEND descriptor, so a crash can at worst cut the last line short.

Draining renames the file to `<spool>.replaying` and starts a fresh spool, so new records
never land in a file about to be deleted; `.replaying` is deleted only after all of its records
are committed, and a later start picks it up if the process died first. Lines that are not
records go to `<spool>.bad` with a warning. A lock file keeps two processes off one spool.
"""

from __future__ import annotations

import base64
import fcntl
import json
import logging
import os
from collections.abc import Generator
from dataclasses import fields
from pathlib import Path
from typing import Any

import orjson

from ..exchange import Exchange
from ..rawcopy import compress_whole
from .engine import StoreError
from .write import stored_bodies

log = logging.getLogger("flightrec.spool")

_VERSION = 1
_FIELDS = tuple(f.name for f in fields(Exchange))
_BYTES_FIELDS = ("request_body", "response_body", "raw_stream_gz")


def encode(ex: Exchange) -> bytes:
    record: dict[str, Any] = {name: getattr(ex, name) for name in _FIELDS}
    bodies = stored_bodies(ex)
    record["request_json"] = bodies.request
    record["response_json"] = bodies.response
    for name in _BYTES_FIELDS:
        raw = getattr(bodies, name)
        record[name] = None if raw is None else base64.b64encode(raw).decode("ascii")
    line = {"v": _VERSION, "exchange": record}
    try:
        return orjson.dumps(line, option=orjson.OPT_NON_STR_KEYS) + b"\n"
    except TypeError:
        return json.dumps(line, default=str).encode() + b"\n"


def decode(line: bytes) -> Exchange:
    """The exchange on one spool line; ValueError if the line is not a record."""
    try:
        outer = orjson.loads(line)
    except orjson.JSONDecodeError:
        outer = json.loads(line)  # ints beyond 64 bits; raises ValueError if not JSON at all
    record = outer.get("exchange") if isinstance(outer, dict) else None
    if not isinstance(outer, dict) or outer.get("v") != _VERSION or not isinstance(record, dict):
        raise ValueError("not a version 1 spool record")
    kwargs = {name: record[name] for name in _FIELDS if name in record}
    for name in _BYTES_FIELDS:
        if kwargs.get(name) is not None:
            kwargs[name] = base64.b64decode(kwargs[name], validate=True)
    if record.get("raw_stream") is not None:  # a line spooled before streams were compressed
        raw = base64.b64decode(record["raw_stream"], validate=True)
        kwargs["raw_stream_gz"] = compress_whole(raw)
    if isinstance(kwargs.get("raw_pacing"), list):
        kwargs["raw_pacing"] = [tuple(pair) for pair in kwargs["raw_pacing"]]
    try:
        ex = Exchange(**kwargs)
    except TypeError as exc:
        raise ValueError(f"incomplete record: {exc}") from None
    if not isinstance(ex.id, str) or not isinstance(ex.started_at, int | float):
        raise ValueError("record without a valid id or started_at")
    return ex


class Spool:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.replaying = self.path.with_name(self.path.name + ".replaying")
        self.bad = self.path.with_name(self.path.name + ".bad")
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._replay_offset = 0

    def open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StoreError(f"spool_path {self.path}: cannot open: {exc.strerror}") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise StoreError(
                f"spool_path {self.path} is in use by another flightrec process: "
                "give each process its own spool_path"
            ) from None
        self._fd = self._open_append()
        self._end_line(self._fd)

    def _end_line(self, fd: int) -> None:
        # A crash mid-append leaves a cut line; end it so the next record is not glued to it.
        with self.path.open("rb") as f:
            if f.seek(0, os.SEEK_END) == 0:
                return
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
        if last != b"\n":
            os.write(fd, b"\n")

    def _open_append(self) -> int:
        # 0600: the spool holds request and response bodies.
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def append(self, exchanges: list[Exchange]) -> None:
        """Append records; raises OSError (disk full, ...), leaving earlier lines intact."""
        data = b"".join(encode(ex) for ex in exchanges)
        fd = self._fd if self._fd is not None else self._open_append()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            if fd != self._fd:
                os.close(fd)

    def pending(self) -> bool:
        if self.replaying.exists():
            return True
        try:
            return self.path.stat().st_size > 0
        except FileNotFoundError:
            return False

    def start_replay(self) -> bool:
        """Make `.replaying` the file to write back; False when there is nothing to write.

        Rotates the live spool unless an earlier replay is unfinished. Call it on the event
        loop's thread: it swaps the descriptor `append` writes to.
        """
        if self.replaying.exists():
            return True
        if not self.pending():
            return False
        os.replace(self.path, self.replaying)
        self._replay_offset = 0
        if self._fd is not None:
            os.close(self._fd)
            self._fd = self._open_append()
        return True

    def batches(self, size: int) -> Generator[tuple[list[Exchange], int]]:
        """The records in `.replaying`, `size` at a time, each batch with its end offset.

        Only reads, so it may run in a worker thread. Call `committed(offset)` after each
        batch is in the database and `finish()` once all are.
        """
        with self.replaying.open("rb") as f:
            f.seek(self._replay_offset)
            batch: list[Exchange] = []
            for line in f:
                if not line.strip():
                    continue
                try:
                    batch.append(decode(line))
                except (ValueError, TypeError, AttributeError) as exc:
                    self._set_aside(line, exc)
                if len(batch) >= size:
                    yield batch, f.tell()
                    batch = []
            yield batch, f.tell()

    def committed(self, offset: int) -> None:
        self._replay_offset = offset

    def finish(self) -> None:
        self.replaying.unlink(missing_ok=True)
        self._replay_offset = 0

    def _append_bad(self, data: bytes) -> None:
        fd = os.open(self.bad, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)

    def _set_aside(self, line: bytes, exc: Exception) -> None:
        self._append_bad(line if line.endswith(b"\n") else line + b"\n")
        log.warning(
            "spool %s: a line is not a record (%s); moved it to %s", self.replaying, exc, self.bad
        )

    def set_aside(self, ex: Exchange, reason: str) -> None:
        """Keep a record the database refuses (not an outage: this record itself) out of the way."""
        self._append_bad(encode(ex))
        log.warning("exchange %s refused by the database (%s); kept in %s", ex.id, reason, self.bad)

    def close(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None
