"""Work every exchange needs and no client waits for, run a moment after the response ended.

Finishing a record (reassembling the stream, reading the control headers, handing it to the
recorder) right after the last byte would put it in the way of the client's next request: a
client that sends requests back to back has its next one on the wire before that work is done,
and the work then stands between that request and its upstream. `Deferred` runs such work in
batches: a batch starts with the first work added and runs `delay` seconds after it (so later
additions wait less), by which time the proxy is waiting on the upstream
(docs/performance.md: the hot path's tricks).

A client alone with the proxy that sends its requests back to back has the next one on the wire
before any delay is over, so the batch would land on that request's way to its first byte
whenever it ran. Then the batch runs as soon as that next exchange's first piece has gone to
the client (`first_piece_sent`): the client now waits for the rest of a response, not for a
first byte. Under concurrency batches keep their timer: larger batches cost less.

`flush()` runs everything still pending at once; the application calls it before the recorder
closes, and from then on new work runs at once, so shutting down loses nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

DELAY = 0.002
"""Seconds. Longer than a proxy takes to send a request on and relay the first byte of the
answer, far shorter than the recorder's batches."""
READ_DELAY = 0.0005
"""Seconds before the tee reads pieces the client has (`StreamTee.relay`): longer than a local
client takes to wake and read them, shorter than most gaps between two events of a stream, so
that reading one seldom delays the next."""


class Deferred:
    def __init__(self, delay: float = DELAY) -> None:
        self._delay = delay
        self._pending: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self.under_way = 0
        """Exchanges between their request's arrival and the hand-over of their record
        (`forward`)."""

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, work: Callable[..., None], *args: Any) -> None:
        """Run `work(*args)` a moment from now (at once once flushed for good)."""
        if self._closed:
            _run(work, args)
            return
        self._pending.append((work, args))
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._delay, self._due)

    def first_piece_sent(self) -> bool:
        """An exchange's first piece of answer has gone to the client: when it is the only
        exchange under way, run what is pending now. True when something ran."""
        if self.under_way == 1 and self._pending:
            self.flush()
            return True
        return False

    def flush(self, *, close: bool = False) -> None:
        """Run everything pending now; with `close`, all later work runs at once too."""
        self._closed = self._closed or close
        if self._timer is not None:
            self._timer.cancel()
        self._due()

    def _due(self) -> None:
        self._timer = None
        pending, self._pending = self._pending, []
        # Each work's arguments are let go as soon as it has run (the list would hold them
        # all to the batch's end): what a record's completion builds, such as a response's
        # parsed JSON, is then freed before the next one is built, not traversed by the
        # collections the batch's later work sets off (docs/performance.md).
        pending.reverse()
        try:
            while pending:
                work, args = pending.pop()
                _run(work, args)
        finally:
            if pending:  # a work raised past `_run` (KeyboardInterrupt): the rest waits
                self._pending[:0] = reversed(pending)


def _run(work: Callable[..., None], args: tuple[Any, ...]) -> None:
    try:
        work(*args)
    except Exception:  # one failure must not cost the records after it
        log.exception("deferred work %s failed", getattr(work, "__qualname__", work))
