"""What the journal could not keep, counted and named in at most one warning a second.

A full or unwritable journal refuses every record that arrives, thousands a second under load;
one line a second says how many were kept in memory only (they still reach the database if it
answers before the process ends) and which were lost (memory was full too).
"""

from __future__ import annotations

import logging
import time

from proxy.store.journal import Journal

log = logging.getLogger(__name__)

EVERY = 1.0
"""Seconds between two warnings at most."""
NAMED = 20
"""Ids named per warning; the rest are counted."""


class Losses:
    def __init__(self, journal: Journal) -> None:
        self._journal = journal
        self.in_memory_total = 0
        """Records the journal refused, since start."""
        self.lost_total = 0
        """Records neither journaled nor kept in memory, since start."""
        self._in_memory = 0
        self._lost: list[str] = []
        self._last = -EVERY
        self._why = ""

    def kept_in_memory(self, count: int, why: str | None = None) -> None:
        """`count` records are kept in memory only: `why`, else the journal's problem."""
        self.in_memory_total += count
        self._in_memory += count
        self._why = why or self._journal.problem or self._why

    def lost(self, ids: list[str], why: str | None = None) -> None:
        """The records of these exchange ids are lost: `why`, else the journal's problem."""
        if not ids:
            return
        self.lost_total += len(ids)
        self._lost += ids
        self._why = why or self._journal.problem or self._why

    def report(self, *, force: bool = False) -> None:
        if not (self._in_memory or self._lost):
            return
        now = time.monotonic()
        if not force and now - self._last < EVERY:
            return
        self._last = now
        why = self._why or f"journal {self._journal.path} unavailable"
        if self._in_memory:
            log.warning(
                "%s: %d records kept in memory only (not safe from a crash)", why, self._in_memory
            )
        if self._lost:
            named = ", ".join(self._lost[:NAMED])
            more = f" and {len(self._lost) - NAMED} more" if len(self._lost) > NAMED else ""
            log.error(
                "%s and memory full: lost %d records: %s%s", why, len(self._lost), named, more
            )
        self._in_memory = 0
        self._lost = []
