"""Prometheus metrics (SPEC section 9): a sink that counts each finished exchange once.

`MetricsSink.accept` runs after the response (`forward._conclude`), never per chunk. The
recorder's health (records written and journaled, queue depth, journal bytes, database up) is
sampled every `REFRESH` seconds. Metrics live in the sink's own registry, which the console
serves at `/metrics`; under `serve --workers N` the supervisor sets `PROMETHEUS_MULTIPROC_DIR`
before it starts the workers, every worker writes its values there, and the console sums them
(`registry()`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any, Protocol, runtime_checkable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from proxy.config import Config
from proxy.exchange import Exchange
from proxy.keynames import KeyNames
from proxy.sinks.timings import HeldTimings
from proxy.stream.endpoints import FREE_ENDPOINT

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
REFRESH = 1.0
"""Seconds between two samples of the recorder's health."""
MAX_VALUES = 500
"""Distinct values a label takes in one process; later ones are counted as "other"."""
MAX_CHILDREN = 10_000
"""Kinds of exchange (`_series`) remembered before starting over."""
SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
FIRST_BYTE_SECONDS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)

# `_created` series double the output and no dashboard reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]


@runtime_checkable
class Health(Protocol):
    """What a recorder tells metrics about itself (`DatabaseRecorder`)."""

    written: int
    journaled: int

    def queue_depth(self) -> int: ...

    def journal_bytes(self) -> int: ...

    def database_up(self) -> bool: ...


def registry(own: CollectorRegistry | None) -> CollectorRegistry | None:
    """What `/metrics` serves: every worker's values under `serve --workers`, else `own`."""
    directory = os.environ.get(MULTIPROC_ENV)
    if not directory:
        return own
    summed = CollectorRegistry()
    MultiProcessCollector(summed, path=directory)  # type: ignore[no-untyped-call]
    return summed


def worker_gone(pid: int | None, directory: str) -> None:
    """A worker's gauges stop counting once it has exited (its counters stay in the sums)."""
    if pid is not None:
        mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]


def status_class(status: int | None) -> str:
    return f"{status // 100}xx" if status else "none"


class _Bounded:
    """A label's values, at most `MAX_VALUES` of them: an unbounded label (a client names any
    model it likes) must not grow the scrape without end."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def __call__(self, value: str | None) -> str:
        if not value:
            return "none"
        if value in self._seen:
            return value
        if len(self._seen) >= MAX_VALUES:
            return "other"
        self._seen.add(value)
        return value


def _usage(ex: Exchange) -> Any:
    """The exchange's usage object as reported, if any."""
    response: Any = ex.response_json if isinstance(ex.response_json, dict) else {}
    return ex.usage if isinstance(ex.usage, dict) else response.get("usage") or None


def _should_cost(ex: Exchange, usage: Any) -> bool:
    """Whether an exchange without a cost counts as unpriced: the cost report's rule
    (`store.cost.is_unpriced`), so the two always agree."""
    paid = (
        ex.model is not None
        and ex.status is not None
        and ex.status < 400
        and not ex.path.endswith(FREE_ENDPOINT)
    )
    return usage is not None or ex.usage_source == "missing" or paid


class MetricsSink:
    """The metrics of SPEC section 9, fed by finished exchanges; a sink (`proxy.sinks.fanout`)."""

    def __init__(self, config: Config, recorder: object = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._health = recorder if isinstance(recorder, Health) else None
        self._extra = config.metrics_labels
        self._model = _Bounded()
        self._user = _Bounded()
        self._key = _Bounded()
        self._names = KeyNames(config.keys)
        self._fingerprints: dict[tuple[str, str], str] = {}
        self._known: dict[tuple[Any, ...], _Series] = {}
        self._written = self._journaled = 0
        self._dropped_held = 0
        self._task: asyncio.Task[None] | None = None
        self._declare_counters(self.registry, list(self._extra))
        self._declare_timings_and_gauges(self.registry)

    def _declare_counters(self, r: CollectorRegistry, extra: list[str]) -> None:
        self.requests = Counter(
            "flightrec_requests",
            "Exchanges finished, by outcome and HTTP status class.",
            ["upstream", "model", "outcome", "status_class", *extra],
            registry=r,
        )
        self.tokens = Counter(
            "flightrec_tokens",
            "Tokens as priced: input (uncached prompt), cached_input, output (reasoning "
            "included), reasoning_output.",
            ["upstream", "model", "type", *extra],
            registry=r,
        )
        self.cost = Counter(
            "flightrec_cost_usd",
            "Spend in USD at the configured price table.",
            ["upstream", "model", *extra],
            registry=r,
        )
        self.unpriced = Counter(
            "flightrec_unpriced_requests",
            "Exchanges with usage that no price covers, or without usage.",
            ["upstream", "model"],
            registry=r,
        )
        self.fingerprint_changes = Counter(
            "flightrec_fingerprint_changes",
            "Times a model's system_fingerprint differed from the one it had before.",
            ["upstream", "model"],
            registry=r,
        )
        self.records_written = Counter(
            "flightrec_records_written", "Records written to the database.", registry=r
        )
        self.records_spooled = Counter(
            "flightrec_records_spooled", "Records appended to the journal.", registry=r
        )
        self.otlp_dropped = Counter(
            "flightrec_otlp_dropped_spans",
            "Spans not delivered: queue full or collector unreachable.",
            registry=r,
        )

    def _declare_timings_and_gauges(self, r: CollectorRegistry) -> None:
        self.duration = Histogram(
            "flightrec_request_duration_seconds",
            "Request arrival to the end of the exchange.",
            ["upstream", "model", "stream"],
            buckets=SECONDS,
            registry=r,
        )
        self.ttft = Histogram(
            "flightrec_time_to_first_token_seconds",
            "Request arrival to the first generated token (streams).",
            ["upstream", "model"],
            buckets=FIRST_BYTE_SECONDS,
            registry=r,
        )
        self.ttfb = Histogram(
            "flightrec_upstream_ttfb_seconds",
            "Request arrival to the upstream's response headers.",
            ["upstream"],
            buckets=FIRST_BYTE_SECONDS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "flightrec_record_queue_depth",
            "Records held in memory for the database writer.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.spool_bytes = Gauge(
            "flightrec_spool_bytes",
            "Bytes of the journal on disk.",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.database_up = Gauge(
            "flightrec_database_up",
            "1 while the database takes writes (the lowest of all workers).",
            registry=r,
            multiprocess_mode="livemin",
        )

    async def start(self) -> None:
        if self._task is None:
            self.sample()
            self._task = asyncio.create_task(self._sampling(), name="flightrec-metrics")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            self.sample()

    async def _sampling(self) -> None:
        while True:
            await asyncio.sleep(REFRESH)
            self.sample()

    def spans_dropped(self, count: int) -> None:
        """The OTLP exporter's drops; called for each span while a collector is down."""
        self._dropped_held += count

    def sample(self) -> None:
        """Bring the metrics up to date: the counts held since the last time, and the
        recorder's health."""
        for series in self._known.values():
            series.flush()
        if self._dropped_held:
            self.otlp_dropped.inc(self._dropped_held)
            self._dropped_held = 0
        health = self._health
        if health is None:
            return
        written, journaled = health.written, health.journaled
        self.records_written.inc(written - self._written)
        self.records_spooled.inc(journaled - self._journaled)
        self._written, self._journaled = written, journaled
        self.queue_depth.set(health.queue_depth())
        self.spool_bytes.set(health.journal_bytes())
        self.database_up.set(1 if health.database_up() else 0)

    def accept(self, exchange: Exchange) -> None:
        # Counting must never cost the record anything; a bare `try`, since
        # `contextlib.suppress` builds a context manager per exchange.
        try:  # noqa: SIM105
            self._count(exchange)
        except Exception:
            pass

    def _series(self, ex: Exchange, model: str | None, key: tuple[Any, ...]) -> _Series:
        """The labelled series of `key` (`_count`), made once per label set: `labels()`
        checks its arguments on every call, and the counting is done per exchange."""
        if len(self._known) >= MAX_CHILDREN:
            self.sample()
            self._known.clear()
        stream = "true" if ex.stream else "false"
        made = self._known[key] = _Series(self, ex.upstream, self._model(model), ex, stream)
        return made

    def _count(self, ex: Exchange) -> None:
        model = ex.model_name
        key = (ex.upstream, model, ex.outcome, ex.status, ex.stream, ex.user, ex.key_hash)
        series = self._known.get(key) or self._series(ex, model, key)
        series.requests_held += 1
        if ex.duration_ms is not None:
            series.duration.observe(ex.duration_ms / 1000)
        if ex.ttft_ms is not None:
            series.ttft.observe(ex.ttft_ms / 1000)
        if ex.ttfb_ms is not None:
            series.ttfb.observe(ex.ttfb_ms / 1000)
        tokens = ex.tokens
        if tokens is not None:
            series.input_held += tokens.input - tokens.cached
            series.cached_input_held += tokens.cached
            series.output_held += tokens.output
            series.reasoning_output_held += tokens.reasoning
        if ex.cost_usd is not None:
            series.cost_held += ex.cost_usd
        elif _should_cost(ex, _usage(ex)):
            series.unpriced_held += 1
        fingerprint = ex.system_fingerprint
        if fingerprint:
            where = (ex.upstream, series.model)
            before = self._fingerprints.get(where)
            if before != fingerprint:
                if before is not None:
                    series.fingerprint_changes.inc()
                if len(self._fingerprints) < MAX_VALUES or before is not None:
                    self._fingerprints[where] = fingerprint


class _Series:
    """The children (labelled series) of every metric one kind of exchange counts in.

    Counts are held in plain numbers and added to the counters by `flush` (every `REFRESH`
    seconds and before a scrape): a counter's `inc` takes a lock, and an exchange counts in
    eight of them (docs/performance.md, *Metrics and traces*)."""

    __slots__ = (
        "cached_input",
        "cached_input_held",
        "cost",
        "cost_held",
        "duration",
        "fingerprint_changes",
        "input",
        "input_held",
        "model",
        "output",
        "output_held",
        "reasoning_output",
        "reasoning_output_held",
        "requests",
        "requests_held",
        "ttfb",
        "ttft",
        "unpriced",
        "unpriced_held",
    )

    def __init__(
        self, sink: MetricsSink, upstream: str, model: str, ex: Exchange, stream: str
    ) -> None:
        extra = [
            sink._user(ex.user)
            if label == "user"
            else sink._key(sink._names.name(ex.key_hash, ex.key_hint) or ex.key_hash)
            for label in sink._extra
        ]
        self.model = model
        self.requests = sink.requests.labels(
            upstream, model, ex.outcome, status_class(ex.status), *extra
        )
        self.duration = HeldTimings(sink.duration.labels(upstream, model, stream), SECONDS)
        self.ttft = HeldTimings(sink.ttft.labels(upstream, model), FIRST_BYTE_SECONDS)
        self.ttfb = HeldTimings(sink.ttfb.labels(upstream), FIRST_BYTE_SECONDS)
        self.input = sink.tokens.labels(upstream, model, "input", *extra)
        self.cached_input = sink.tokens.labels(upstream, model, "cached_input", *extra)
        self.output = sink.tokens.labels(upstream, model, "output", *extra)
        self.reasoning_output = sink.tokens.labels(upstream, model, "reasoning_output", *extra)
        self.cost = sink.cost.labels(upstream, model, *extra)
        self.unpriced = sink.unpriced.labels(upstream, model)
        self.fingerprint_changes = sink.fingerprint_changes.labels(upstream, model)
        self.requests_held = self.unpriced_held = 0
        self.input_held = self.cached_input_held = 0
        self.output_held = self.reasoning_output_held = 0
        self.cost_held = 0.0

    def flush(self) -> None:
        for name in _HELD:
            held = getattr(self, name + "_held")
            if held:
                getattr(self, name).inc(held)
                setattr(self, name + "_held", 0)
        self.duration.flush()
        self.ttft.flush()
        self.ttfb.flush()


_HELD = ("requests", "unpriced", "input", "cached_input", "output", "reasoning_output", "cost")
