"""Where finished exchanges go besides the recorder (metrics, traces)."""

from __future__ import annotations

from typing import Protocol

from .exchange import Exchange


class Sink(Protocol):
    async def start(self) -> None:
        """Start background work (called once the event loop runs)."""

    def accept(self, exchange: Exchange) -> None:
        """Take a finished exchange, whatever its outcome. Never blocks, never raises."""

    async def stop(self) -> None:
        """Finish what was taken, within bounds, then stop."""
