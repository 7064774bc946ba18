"""Where finished exchanges go.

The forwarder hands every exchange, whatever its outcome, to its sinks (`sinks.py`); the recorder
is the first of them (`sinks.RecorderSink`). `record()` must never block the relay and never
raise: the database recorder queues the exchange for a background writer.
"""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

from .exchange import Exchange


class Recorder(Protocol):
    async def start(self) -> None:
        """Start background work (called once the event loop runs)."""

    def record(self, exchange: Exchange) -> None:
        """Take a finished exchange. Never blocks, never raises."""

    def ready(self) -> bool:
        """True while records can reach their destination without piling up."""

    async def close(self) -> None:
        """Write out everything taken so far, then stop."""


@runtime_checkable
class Explains(Protocol):
    """A recorder that can say why it is not ready (`/readyz` puts it in its answer)."""

    def readiness(self) -> str | None:
        """None when ready; else one line saying why not."""


class MemoryRecorder:
    """Keeps exchanges in a list: for tests and for `serve` without a database."""

    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []
        self._arrived = asyncio.Event()

    async def start(self) -> None:
        pass

    def record(self, exchange: Exchange) -> None:
        self.exchanges.append(exchange)
        self._arrived.set()

    def ready(self) -> bool:
        return True

    async def close(self) -> None:
        pass

    async def wait_for(self, count: int, within: float = 5.0) -> list[Exchange]:
        """Wait until at least `count` exchanges were recorded; returns them all."""
        async with asyncio.timeout(within):
            while len(self.exchanges) < count:
                self._arrived.clear()
                await self._arrived.wait()
        return self.exchanges
