"""The exchanges in flight, and what SIGTERM does to them: `shutdown_grace` to finish, then
the cut.

A container engine sends SIGKILL a fixed time after SIGTERM (Docker and podman 10 s,
Kubernetes 30 s, unless told otherwise), so an exchange that outlasts the grace must still be
recorded, and journaled, before then. aiohttp's own shutdown waits for a running handler up to
its timeout twice over before it cancels it, and does not wait for what it cancelled, so the
record of a handler cut that way could reach the sinks after they had stopped. Here the relay
stops listening, waits up to `shutdown_grace` for the exchanges in flight, then cancels those
left and waits for their handlers, whose records say they were cut (`forward`), to hand them
over; only then does the application stop its sinks.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

log = logging.getLogger(__name__)

CUT_WAIT = 2.0
"""Seconds a cut handler gets to hand its record over: it has nothing left to wait for."""


class InFlight:
    """The tasks relaying exchanges now (`forward` enters and leaves)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self.cut: str | None = None
        """Once shutdown has cut the exchanges left: the error their records carry."""

    def __len__(self) -> int:
        return len(self._tasks)

    def enter(self) -> asyncio.Task[Any] | None:
        """Count the current task in; returns it, for `leave`."""
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        return task

    def leave(self, task: asyncio.Task[Any] | None) -> None:
        """Count out the task `enter` returned."""
        if task is not None:
            self._tasks.discard(task)

    async def finish(self, grace: float) -> int:
        """Wait up to `grace` seconds for the exchanges in flight; cut those still running
        and wait for their handlers to record them. How many were cut."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self._tasks and loop.time() < deadline:
            await asyncio.wait(
                set(self._tasks),
                timeout=deadline - loop.time(),
                return_when=asyncio.FIRST_COMPLETED,
            )
        left = set(self._tasks)
        if not left:
            return 0
        self.cut = f"cut at shutdown: shutdown_grace ({grace:g}s) over"
        for task in left:
            task.cancel()
        await asyncio.wait(left, timeout=CUT_WAIT)
        return len(left)


async def stop_relay(runner: web.AppRunner, in_flight: InFlight, grace: float) -> None:
    """Stop accepting, let the exchanges in flight finish within `grace`, cut the rest, then
    clean the application up (its sinks deliver what they hold)."""
    for site in list(runner.sites):
        await site.stop()
    if runner.server is not None:
        runner.server.pre_shutdown()  # idle kept-alive connections close; busy ones after
    cut = await in_flight.finish(grace)
    if cut:
        log.warning(
            "shutdown grace (%gs) over: cut %d exchanges still running; recorded as cut",
            grace,
            cut,
        )
    await runner.cleanup()
