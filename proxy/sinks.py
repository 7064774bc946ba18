"""Where a finished exchange goes: a list of sinks, each told once per exchange.

The forwarder hands every exchange, whatever its outcome, to `Sinks.accept` (`record.conclude`);
`Sinks` gives it to each sink in order. The database recorder is the first sink; metrics and
traces are others, added with `build_app(..., sinks=[...])` and nothing else. A sink reacts to
that one event, as a mitmproxy addon reacts to one hook, and never to the order of others.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from .exchange import Exchange
from .keep import Keep
from .recorder import Recorder

log = logging.getLogger(__name__)


class Sink(Protocol):
    async def start(self) -> None:
        """Start background work (called once the event loop runs, before any exchange)."""

    def accept(self, exchange: Exchange) -> None:
        """Take a finished exchange, whatever its outcome. Never blocks, never raises."""

    async def stop(self) -> None:
        """Deliver everything accepted so far, then stop (after the last exchange)."""


class RecorderSink:
    """The recorder (database or memory) as a sink."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    async def start(self) -> None:
        await self.recorder.start()

    def accept(self, exchange: Exchange) -> None:
        self.recorder.record(exchange)

    async def stop(self) -> None:
        await self.recorder.close()


class Sinks:
    """The application's sinks: started in order, stopped in reverse order; one sink that
    fails never keeps an exchange from the others. Before any sink sees an exchange, `keep`
    takes out of it what the record may not keep (omitted bodies, redaction)."""

    def __init__(self, sinks: Sequence[Sink], keep: Keep | None = None) -> None:
        self._sinks = tuple(sinks)
        self._keep = keep or Keep()

    async def start(self) -> None:
        started: list[Sink] = []
        try:
            for sink in self._sinks:
                await sink.start()
                started.append(sink)
        except BaseException:  # the server will not run: stop what did start
            await Sinks(started).stop()
            raise

    def accept(self, exchange: Exchange) -> None:
        self._keep(exchange)
        for sink in self._sinks:
            try:
                sink.accept(exchange)
            except Exception:  # a sink's bug costs that sink the exchange, not the others
                log.exception("sink %s failed to take exchange %s", _name(sink), exchange.id)

    async def stop(self) -> None:
        for sink in reversed(self._sinks):
            try:
                await sink.stop()
            except Exception:  # the others still deliver what they hold
                log.exception("sink %s failed to stop", _name(sink))


def _name(sink: Sink) -> str:
    return type(sink).__qualname__
