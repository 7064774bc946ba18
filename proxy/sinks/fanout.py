"""Where a finished exchange goes: a list of sinks, each told once per exchange.

The forwarder hands every exchange, whatever its outcome, to `Sinks.accept` (`record.conclude`);
`Sinks` settles its figures (`settle.py`: usage decoded and priced, once) and gives it to each
sink in order. The database recorder is the first sink; metrics and traces are others, added
with `build_app(..., sinks=[...])` and nothing else. The recorder is a sink that can also say
whether the record is safe (`Recorder`). A sink reacts to that one event, as a mitmproxy addon
reacts to one hook, and never to the order of others.

With `[[redact]]` rules, `Keep` runs on one worker thread, exchanges in the order accepted, and
each kept exchange goes to the sinks back on the event loop, in that order: a long redaction
does not hold every other request (the loop gets the GIL back between the redactor's steps,
though not during one regular-expression search, which holds it). `stop` first waits (up to
`grace` seconds) for the exchanges being redacted and delivers them; one still unfinished then
is delivered without its bodies. An exchange being redacted is not yet journaled: a kill -9
loses it, as it loses any exchange not yet journaled. Without rules, `Keep` runs in `accept`.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from proxy.exchange import Exchange
from proxy.pricing import Prices
from proxy.privacy import keep
from proxy.privacy.keep import Keep
from proxy.sinks.settle import settle

log = logging.getLogger(__name__)


class Sink(Protocol):
    async def start(self) -> None:
        """Start background work (called once the event loop runs, before any exchange)."""

    def accept(self, exchange: Exchange) -> None:
        """Take a finished exchange, whatever its outcome. Never blocks, never raises."""

    async def stop(self) -> None:
        """Deliver everything accepted so far, then stop (after the last exchange)."""


class Recorder(Sink, Protocol):
    """The sink that keeps the record (the database, or memory): the first of the sinks, and
    the one `/readyz` asks."""

    def readiness(self) -> str | None:
        """None while records reach their destination without piling up; else one line
        saying why not (`/readyz/db`)."""

    def safety(self) -> str | None:
        """None while records are kept safe though their destination may lag (a journal);
        else one line saying why not (`/readyz`)."""

    def database_state(self) -> str | None:
        """None while the destination takes records as they come; else one line saying why
        not (what `/readyz` says of the database)."""


class MemoryRecorder:
    """Keeps exchanges in a list: for tests and for `serve` without a database."""

    def __init__(self) -> None:
        self.exchanges: list[Exchange] = []
        self._arrived = asyncio.Event()

    async def start(self) -> None:
        pass

    def accept(self, exchange: Exchange) -> None:
        self.exchanges.append(exchange)
        self._arrived.set()

    def readiness(self) -> str | None:
        return None

    def safety(self) -> str | None:
        return None

    def database_state(self) -> str | None:
        return None

    async def stop(self) -> None:
        pass

    async def wait_for(self, count: int, within: float = 5.0) -> list[Exchange]:
        """Wait until at least `count` exchanges were recorded; returns them all."""
        async with asyncio.timeout(within):
            while len(self.exchanges) < count:
                self._arrived.clear()
                await self._arrived.wait()
        return self.exchanges


class Sinks:
    """The application's sinks: started in order, stopped in reverse order; one sink that
    fails never keeps an exchange from the others. Before any sink sees an exchange, `keep`
    takes out of it what the record may not keep (omitted bodies, redaction)."""

    def __init__(
        self,
        sinks: Sequence[Sink],
        keep: Keep | None = None,
        grace: float = 30,
        prices: Prices | None = None,
    ) -> None:
        self._sinks = tuple(sinks)
        self._prices = prices or Prices()
        self._keep = keep or Keep()
        self._grace = grace
        self._worker = None if self._keep.redactor is None else ThreadPoolExecutor(1, "keep")
        self._kept: deque[tuple[Exchange, asyncio.Future[None]]] = deque()
        """Exchanges handed to the worker, in the order accepted, each with its `Keep` run."""

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
        try:
            settle(exchange, self._prices)
        except Exception:  # a pricing bug costs the exchange its price, not its record
            log.exception("exchange %s: pricing it failed", exchange.id)
        if self._worker is None:
            self._keep(exchange)
            self._deliver(exchange)
            return
        run = asyncio.get_running_loop().run_in_executor(self._worker, self._keep, exchange)
        self._kept.append((exchange, run))
        run.add_done_callback(self._kept_done)

    def _kept_done(self, _: object = None) -> None:
        """Deliver the exchanges whose `Keep` ended, in the order they were accepted."""
        while self._kept and self._kept[0][1].done():
            exchange, run = self._kept.popleft()
            if run.cancelled() or run.exception() is not None:
                log.error("exchange %s: keeping it failed (%r)", exchange.id, run)
                exchange = bodiless(exchange)
            self._deliver(exchange)

    def _deliver(self, exchange: Exchange) -> None:
        # A batch result is not a request through the proxy, and is seen again with every
        # download of its file: only the recorder (the first sink), which books it once,
        # takes it.
        sinks = self._sinks[:1] if exchange.batch_line is not None else self._sinks
        for sink in sinks:
            try:
                sink.accept(exchange)
            except Exception:  # a sink's bug costs that sink the exchange, not the others
                log.exception("sink %s failed to take exchange %s", _name(sink), exchange.id)

    async def stop(self) -> None:
        await self._drain()
        for sink in reversed(self._sinks):
            try:
                await sink.stop()
            except Exception:  # the others still deliver what they hold
                log.exception("sink %s failed to stop", _name(sink))

    async def _drain(self) -> None:
        """Deliver every exchange handed to the worker (without its bodies if its redaction
        has not ended within `grace`); later exchanges are kept in `accept`."""
        worker, self._worker = self._worker, None
        if worker is None:
            return
        if self._kept:
            _, late = await asyncio.wait([run for _, run in self._kept], timeout=self._grace)
            if late:
                log.error(
                    "%d exchanges still being redacted after %ss: recorded without bodies",
                    len(late),
                    self._grace,
                )
        self._kept_done()
        while self._kept:
            self._deliver(bodiless(self._kept.popleft()[0]))
        worker.shutdown(wait=False, cancel_futures=True)


def bodiless(exchange: Exchange) -> Exchange:
    """A copy of `exchange` as `Keep` leaves one whose redaction failed: no body, none of the
    texts a rule could have matched, and a note saying so (the redaction may still be changing
    the exchange itself)."""
    ex = copy.copy(exchange)
    keep.failed(ex)
    return ex


def _name(sink: Sink) -> str:
    return type(sink).__qualname__
