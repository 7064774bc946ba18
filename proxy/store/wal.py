"""The SQLite log (WAL) of the recorder's database: its checkpoint, and the watch that tells
the operator when checkpoints fail or cannot keep the log from growing (`sqlite_writer`
decides when they run)."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sqlite3

log = logging.getLogger(__name__)

WAL_WARN_BYTES = 256 * 1024 * 1024
"""A log past this size that is still growing is reported: checkpoints are not keeping up."""
WARN_EVERY = 60.0
"""Seconds between two warnings about the log while the trouble lasts."""


def checkpoint(path: str) -> bool:
    """A passive checkpoint: copies what it can without waiting for readers or writers.
    Whether it copied the whole log (nothing kept it from a page, every frame copied)."""
    with contextlib.closing(sqlite3.connect(path, timeout=5.0, isolation_level=None)) as con:
        busy, frames, copied = con.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    return not busy and frames == copied


class WalWatch:
    """Tells the operator when WAL checkpoints fail or the log keeps growing: at once when the
    trouble starts, then at most every `WARN_EVERY` seconds, never once per batch."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.wal = f"{path}-wal"
        self._failing = False
        self._warned_at = -math.inf
        self._warned_size = WAL_WARN_BYTES

    def checked(self, now: float, error: str | None) -> None:
        """After each checkpoint: `error` is why it failed, None when it ran."""
        size = log_size(self.path)
        quiet = now - self._warned_at < WARN_EVERY
        if error is not None:
            if not self._failing or not quiet:
                log.warning(
                    "WAL checkpoint of %s failing (%s): its log %s holds %.1f MB and grows with "
                    "every write until a checkpoint succeeds",
                    self.path,
                    error,
                    self.wal,
                    size / 1e6,
                )
                self._warned_at = now
            self._failing = True
        elif self._failing:
            self._failing = False
            log.info("WAL checkpoint of %s works again", self.path)
        elif size > self._warned_size and not quiet:
            log.warning(
                "the SQLite log %s has grown to %.1f MB: checkpoints cannot bring it back to "
                "its start while readers use it (a long query or an open transaction)",
                self.wal,
                size / 1e6,
            )
            self._warned_at, self._warned_size = now, size
        elif size <= WAL_WARN_BYTES:
            self._warned_size = WAL_WARN_BYTES


def log_size(path: str) -> int:
    """The size of the log of the database at `path` (0 when it has none)."""
    try:
        return os.stat(f"{path}-wal").st_size
    except OSError:
        return 0
