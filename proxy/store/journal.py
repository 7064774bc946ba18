"""The journal: every finished exchange on local disk, before and independent of the database.

One JSON line per exchange (`store.lines`), holding exactly what the database would store,
appended to `spool_path` with one `os.write` per batch on an O_APPEND descriptor (mode 0600).
Nothing is fsynced while the proxy runs (an fsync on the event loop's thread would hold up the
relay, and data deleted once committed then need never reach the disk): a line is safe from a
crash of the process as soon as `append` returns, not from a power loss. The files are fsynced
on close.

Where a line is, is a position `(segment, offset)`. The live segment is the file at
`spool_path`; past `segment_bytes` it is renamed `<spool_path>.seg<n>` and a new one starts.
The database writer reads the journal in order and marks how far it has committed in
`<spool_path>.done` (`segment offset`, rewritten in place): segments wholly before that
position are deleted, and a live segment committed to its end is emptied, so the journal holds
only what the database may not have yet. A restart carries on from `.done`; what is read twice
after a crash is stored once (writes are idempotent by exchange id).

`max_bytes` bounds the files: an append that would pass it is refused, as is one the disk
refuses (full, read-only, not writable); the caller keeps those records in memory and `problem`
says why until an append succeeds again. Lines that are not records, and records the database
refuses, go to `<spool_path>.bad`. A lock file keeps two processes off one journal.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import time
from pathlib import Path
from typing import BinaryIO

from proxy.exchange import Exchange
from proxy.store.engine import StoreError
from proxy.store.lines import decode, whole_lines

log = logging.getLogger(__name__)

Position = tuple[int, int]
"""(segment number, byte offset): where a line starts or ends; compares in journal order."""

SEGMENT_BYTES = 64 * 1024 * 1024
"""Bytes after which the live segment is sealed, so committed data can be deleted."""
_EMPTY_AT = 1024 * 1024
"""Bytes of a wholly committed live segment worth emptying at once."""
_RETRY_SEAL = 10.0
"""Seconds before sealing a segment is tried again after the directory refused it."""
_DONE_FORMAT = b"%020d %020d\n"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Journal:
    """Use from the event loop's thread, except `read`, which only reads (a worker thread)."""

    def __init__(self, path: str | os.PathLike[str], max_bytes: int) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.segment_bytes = min(SEGMENT_BYTES, max(max_bytes // 4, 4096))
        self.bad = self._sibling(".bad")
        self.problem: str | None = None
        """Why the last append was refused (full, not writable); None while appends succeed."""
        self.live = 1
        """The live segment's number."""
        self.size = 0
        """Bytes in the live segment (all whole lines)."""
        self.done: Position = (1, 0)
        """Everything before this position is in the database."""
        self._sealed: dict[int, int] = {}  # segment number -> bytes
        self._fd: int | None = None
        self._done_fd: int | None = None
        self._lock_fd: int | None = None
        self._cut = False  # a failed append may have left a cut line at the end
        self._next_open = 0.0
        self._next_seal = 0.0
        self._next_probe = 0.0
        self._full: str | None = None  # `problem` when it is that the journal was full

    def _sibling(self, suffix: str) -> Path:
        return self.path.with_name(self.path.name + suffix)

    def segment_path(self, number: int) -> Path:
        return self.path if number == self.live else self._sibling(f".seg{number}")

    @property
    def end(self) -> Position:
        return (self.live, self.size)

    @property
    def total_bytes(self) -> int:
        return self.size + sum(self._sealed.values())

    def open(self) -> None:
        """Lock and open the journal and find where the writer stopped.

        Raises `StoreError` if another process holds it. A directory or file that cannot be
        written is not fatal: `problem` says so, and `append` tries again later.
        """
        if self._lock_fd is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self._sibling(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            self.problem = f"journal {self.path} not writable: {exc.strerror}"
            return
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise StoreError(
                f"spool_path {self.path} is in use by another flightrec process: "
                "give each process its own spool_path"
            ) from None
        self._find_segments()
        if self.reopen() and self.done[0] == self.live and self.done[1] > self.size:
            self.done = (self.live, 0)  # `.done` ahead of the file: read it all again

    def _open_again(self) -> bool:
        """Try `open` again after it failed, at most once a second."""
        now = time.monotonic()
        if now < self._next_open:
            return False
        self._next_open = now + 1.0
        try:
            self.open()
        except StoreError as exc:
            self.problem = str(exc)
        return self._lock_fd is not None

    def _find_segments(self) -> None:
        pattern = re.compile(re.escape(self.path.name) + r"\.seg(\d+)")
        for entry in self.path.parent.iterdir():
            if (found := pattern.fullmatch(entry.name)) is not None:
                with contextlib.suppress(OSError):
                    self._sealed[int(found.group(1))] = entry.stat().st_size
        with contextlib.suppress(OSError, ValueError):
            segment, offset = self._sibling(".done").read_bytes().split()
            self.done = (int(segment), int(offset))
        # The live segment is the one after the last sealed, or the one `.done` is in.
        self.live = max([*self._sealed, self.done[0] - 1]) + 1
        for number in [n for n in self._sealed if n < self.done[0]]:  # committed, not deleted
            self._delete(number)
        if not self._sealed and self.done[0] < self.live:
            self.done = (self.live, 0)
        elif self._sealed and self.done[0] not in self._sealed and self.done[0] != self.live:
            self.done = (min(self._sealed), 0)

    def reopen(self) -> bool:
        """Open the live segment and `.done` if they are not; False (and `problem`) if not."""
        try:
            if self._done_fd is None:
                self._done_fd = os.open(self._sibling(".done"), os.O_RDWR | os.O_CREAT, 0o600)
            if self._fd is None:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                self.size = os.fstat(fd).st_size
                self._fd = fd
                if self.size and self._last_byte() != b"\n":
                    self._cut = True  # a crash mid-append: end that line before the next
        except OSError as exc:
            self.problem = f"journal {self.path} not writable: {exc.strerror}"
            return False
        return True

    def _last_byte(self) -> bytes:
        with self.path.open("rb") as f:
            f.seek(-1, os.SEEK_END)
            return f.read(1)

    def append(self, lines: list[bytes]) -> list[Position] | None:
        """Append encoded records; their end positions, or None when refused (see `problem`)."""
        if self._lock_fd is None and not self._open_again():
            return None
        if self._fd is None and not self.reopen():
            return None
        assert self._fd is not None
        data = b"".join(lines)
        lead = b""
        if self._cut:  # a failed append left part of itself: start after it, on a new line
            lead = b"\n"
            with contextlib.suppress(OSError):
                self.size = os.fstat(self._fd).st_size
        if self.total_bytes + len(lead) + len(data) > self.max_bytes:
            self.problem = self._full = (
                f"journal {self.path} full (journal_max_bytes = {self.max_bytes})"
            )
            return None
        try:
            _write_all(self._fd, lead + data)
        except OSError as exc:
            self._undo_cut()
            self.problem = f"journal {self.path} not writable: {exc.strerror}"
            return None
        self._cut = False
        self.problem = None
        ends: list[Position] = []
        offset = self.size + len(lead)
        for line in lines:
            offset += len(line)
            ends.append((self.live, offset))
        self.size = offset
        if self.size >= self.segment_bytes and time.monotonic() >= self._next_seal:
            self._seal()
        return ends

    def probe(self) -> None:
        """While the journal refuses records (not writable, disk full), try it again at most
        once a second with a blank line, which readers skip: once it has room again it says
        so without waiting for a record, since a proxy that is not ready gets no traffic."""
        if self.problem is None or self.problem == self._full:
            return  # a full journal is ready again once commits free room
        now = time.monotonic()
        if now >= self._next_probe:
            self._next_probe = now + 1.0
            self.append([b"\n"])

    def append_closed(self, lines: list[bytes]) -> bool:
        """Append records after `close` (for the next start to read); False if refused."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            self.problem = f"journal {self.path} not writable: {exc.strerror}"
            return False
        try:
            _write_all(fd, b"".join(lines))
        except OSError as exc:
            self.problem = f"journal {self.path} not writable: {exc.strerror}"
            return False
        finally:
            os.close(fd)
        return True

    def _undo_cut(self) -> None:
        """After a failed append, drop whatever part of it reached the file."""
        assert self._fd is not None
        try:
            if os.fstat(self._fd).st_size != self.size:
                os.ftruncate(self._fd, self.size)
        except OSError:
            self._cut = True

    def _seal(self) -> None:
        """Rename the live segment `.seg<n>` and start the next one."""
        assert self._fd is not None
        sealed = self._sibling(f".seg{self.live}")
        try:
            os.rename(self.path, sealed)
        except OSError as exc:  # keep appending to this segment; try again in a while
            self._next_seal = time.monotonic() + _RETRY_SEAL
            log.warning("journal %s: cannot start a new segment: %s", self.path, exc.strerror)
            return
        os.close(self._fd)
        self._fd = None
        self._sealed[self.live] = self.size
        self.live += 1
        self.size = 0
        self.reopen()

    def commit(self, done: Position) -> None:
        """Everything before `done` is in the database: note it, and delete what that frees."""
        if done <= self.done:
            return
        self._mark(done)
        if self.size >= _EMPTY_AT:
            self._empty_if_committed()
        for number in [n for n in self._sealed if n < done[0]]:
            self._delete(number)
        if self.problem is not None and self.problem == self._full:
            self.problem = self._full = None  # room again: no longer a reason to be unready

    def _empty_if_committed(self) -> None:
        """Empty a live segment committed to its end, under its next number (no rename needed,
        so this works in a directory that is no longer writable). Marked first: a crash in
        between reads the old lines again, which are stored once."""
        if self.done != self.end or self._fd is None or not self.size:
            return
        committed = self.done
        self._mark((self.live + 1, 0))
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            self._mark(committed)
        else:
            self.live += 1
            self.size = 0

    def _mark(self, done: Position) -> None:
        self.done = done
        if self._done_fd is not None:
            with contextlib.suppress(OSError):
                os.pwrite(self._done_fd, _DONE_FORMAT % done, 0)

    def _delete(self, number: int) -> None:
        try:
            self._sibling(f".seg{number}").unlink(missing_ok=True)
        except OSError as exc:
            log.warning("journal: cannot delete the committed %s.seg%d: %s", self.path, number, exc)
            return
        del self._sealed[number]

    def next_segment(self, at: Position) -> Position | None:
        """The start of the segment after the one `at` is in, if it is sealed and read whole."""
        if at[0] == self.live:
            return None
        later = [n for n in [*self._sealed, self.live] if n > at[0]]
        return (min(later), 0)

    def limit(self, at: Position) -> int | None:
        """How far a reader may read the segment `at` is in; None if it is gone."""
        if at[0] == self.live:
            return self.size
        return self._sealed.get(at[0])

    def open_segment(self, number: int) -> BinaryIO:
        """The segment for `read`; opened on the loop's thread, which renames segments."""
        return self.segment_path(number).open("rb")

    def read(
        self, f: BinaryIO, at: Position, limit: int, count: int
    ) -> tuple[list[tuple[Exchange, Position]], int]:
        """Up to `count` records of `f` (the segment `at` is in) from `at` to `limit` (a byte
        offset), each with its end position, and the offset reading stopped at; closes `f`.
        Only reads and sets aside lines that are not records, so it may run in a worker
        thread."""
        found: list[tuple[Exchange, Position]] = []
        segment, offset = at
        with f:
            f.seek(offset)
            for line in whole_lines(f, limit - offset):
                offset += len(line)
                if line.strip():
                    try:
                        found.append((decode(line), (segment, offset)))
                    except (ValueError, TypeError, AttributeError) as exc:
                        self._set_aside_line(line, exc)
                if len(found) >= count:
                    break
        return found, offset

    def _append_bad(self, data: bytes) -> None:
        fd = os.open(self.bad, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)

    def _set_aside_line(self, line: bytes, exc: Exception) -> None:
        try:
            self._append_bad(line if line.endswith(b"\n") else line + b"\n")
        except OSError as error:
            log.error(
                "journal %s: a line is not a record (%s) and %s: %s",
                self.path,
                exc,
                self.bad,
                error,
            )
            return
        log.warning(
            "journal %s: a line is not a record (%s); moved it to %s", self.path, exc, self.bad
        )

    def set_aside(self, exchange_id: str, line: bytes, reason: str) -> None:
        """Keep a record the database refuses (not an outage: this record itself) out of the way:
        its journal `line` (`lines.encode`)."""
        try:
            self._append_bad(line)
        except OSError as exc:
            log.error(
                "exchange %s refused by the database (%s); lost: %s: %s",
                exchange_id,
                reason,
                self.bad,
                exc,
            )
            return
        log.warning(
            "exchange %s refused by the database (%s); kept in %s", exchange_id, reason, self.bad
        )

    def close(self) -> None:
        self._empty_if_committed()
        for name in ("_fd", "_done_fd", "_lock_fd"):
            fd: int | None = getattr(self, name)
            if fd is not None:
                with contextlib.suppress(OSError):
                    if name != "_lock_fd":
                        os.fsync(fd)
                os.close(fd)  # closing the lock file releases the flock
                setattr(self, name, None)
