"""OpenTelemetry traces: one span per exchange, sent over OTLP/HTTP (protobuf); a sink.

`accept` only queues the exchange (at most `QUEUE` of them; past that a span is dropped and
counted); a background task turns up to `BATCH` queued exchanges into spans and posts them in
one request, at least every `INTERVAL` seconds. A collector that is slow or down costs spans,
never the relay or the record: a failed export drops its batch, counts it, warns at most once
a minute, and the exporter rests (`RETRY_MIN` doubling to `RETRY_MAX`) before the next try.
Span attributes follow the OpenTelemetry GenAI semantic conventions (docs/metrics.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from proxy.config import Config
from proxy.exchange import Exchange
from proxy.sinks.otlp_content import content_attributes

log = logging.getLogger(__name__)

QUEUE = 2048
"""Exchanges waiting to be exported; more are dropped."""
BATCH = 256
INTERVAL = 1.0
"""Seconds the exporter waits for a batch to fill."""
TIMEOUT = 5.0
"""Seconds one export may take."""
WARN_EVERY = 60.0
"""Seconds between two warnings about a collector that does not take spans."""
RETRY_MIN, RETRY_MAX = 1.0, 30.0
"""Seconds the exporter waits after a failed export before it tries again (doubling); spans
of exchanges that finish meanwhile are dropped at once, never built."""

OPERATIONS = (
    ("/chat/completions", "chat"),
    ("/completions", "text_completion"),
    ("/responses", "chat"),
    ("/embeddings", "embeddings"),
)
"""GenAI `gen_ai.operation.name` by endpoint; other endpoints use their last path segment. The
OpenAI conventions name a Responses API call `chat` too, told apart by `openai.api.type`."""
API_TYPES = (("/chat/completions", "chat_completions"), ("/responses", "responses"))
"""`openai.api.type` by endpoint (the OpenAI conventions' two values)."""


def operation(path: str) -> str:
    for suffix, name in OPERATIONS:
        if path.endswith(suffix):
            return name
    return path.rstrip("/").rpartition("/")[2] or "request"


def parent(traceparent: str | None) -> tuple[bytes, bytes] | None:
    """(trace id, parent span id) of a W3C `traceparent` header; None unless it is valid."""
    if not traceparent:
        return None
    parts = traceparent.strip().split("-")
    if len(parts) < 4 or len(parts[0]) != 2 or parts[0] == "ff":
        return None
    trace, span = parts[1], parts[2]
    if len(trace) != 32 or len(span) != 16 or len(parts[3]) != 2:
        return None
    try:
        trace_id, span_id = bytes.fromhex(trace), bytes.fromhex(span)
    except ValueError:
        return None
    if not any(trace_id) or not any(span_id):
        return None
    return trace_id, span_id


def _value(value: str | bool | int | float | list[str]) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, list):
        return AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=v) for v in value]))
    return AnyValue(string_value=value)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _finish_reasons(response: dict[str, Any]) -> list[str]:
    choices = response.get("choices")
    if not isinstance(choices, list):
        return []
    reasons = (c.get("finish_reason") for c in choices if isinstance(c, dict))
    return [r for r in reasons if isinstance(r, str)]


class SpanBuilder:
    """Spans of exchanges; content only when `content` and the client omitted nothing."""

    def __init__(self, config: Config) -> None:
        self._content = config.otlp_content
        self._max_bytes = config.otlp_content_max_bytes
        self._servers: dict[str, str] = {}

    def span(self, ex: Exchange) -> Span:
        op = operation(ex.path)
        model = ex.model_name
        name = f"{op} {model}" if model else op
        found = parent(ex.traceparent)
        trace_id, parent_id = found if found is not None else (os.urandom(16), b"")
        start = int(ex.started_at * 1e9)
        end = start + int((ex.duration_ms or 0.0) * 1e6)
        attributes = list(self._attributes(ex, op))
        failed = ex.outcome != "ok"
        status = Status(
            code=Status.STATUS_CODE_ERROR if failed else Status.STATUS_CODE_UNSET,
            message=(ex.error or "") if failed else "",
        )
        return Span(
            trace_id=trace_id,
            span_id=os.urandom(8),
            parent_span_id=parent_id,
            name=name,
            kind=Span.SPAN_KIND_CLIENT,
            start_time_unix_nano=start,
            end_time_unix_nano=end,
            attributes=[KeyValue(key=k, value=_value(v)) for k, v in attributes],
            status=status,
        )

    def _attributes(self, ex: Exchange, op: str) -> Iterator[tuple[str, Any]]:
        response: dict[str, Any] = ex.response_json if isinstance(ex.response_json, dict) else {}
        request: dict[str, Any] = ex.request_json if isinstance(ex.request_json, dict) else {}
        response_model = ex.response_model or _text(response.get("model"))
        yield "gen_ai.operation.name", op
        yield "gen_ai.provider.name", "openai"
        for suffix, api_type in API_TYPES:
            if ex.path.endswith(suffix):
                yield "openai.api.type", api_type
        if ex.model:
            yield "gen_ai.request.model", ex.model
        if response_model:
            yield "gen_ai.response.model", response_model
        if response_id := _text(response.get("id")):
            yield "gen_ai.response.id", response_id
        if reasons := _finish_reasons(response):
            yield "gen_ai.response.finish_reasons", reasons
        tokens = ex.tokens
        if tokens is not None:
            yield "gen_ai.usage.input_tokens", tokens.input
            yield "gen_ai.usage.output_tokens", tokens.output
            yield "gen_ai.usage.cache_read.input_tokens", tokens.cached
            yield "gen_ai.usage.reasoning.output_tokens", tokens.reasoning
        yield "gen_ai.request.stream", ex.stream
        yield "server.address", self._server(ex.upstream_url)
        if ex.outcome != "ok":
            yield "error.type", ex.outcome
        if ex.status is not None:
            yield "http.response.status_code", ex.status
        if fingerprint := ex.system_fingerprint or _text(response.get("system_fingerprint")):
            yield "openai.response.system_fingerprint", fingerprint
        if tier := ex.service_tier:
            yield "openai.response.service_tier", tier
        yield "flightrec.exchange_id", ex.id
        if ex.cost_usd is not None:
            yield "flightrec.cost_usd", float(ex.cost_usd)
            yield "flightrec.price_entry", ex.price_entry or ""
        if ex.usage_source:
            yield "flightrec.usage_source", ex.usage_source
        if ex.ttft_ms is not None:
            yield "flightrec.ttft_ms", float(ex.ttft_ms)
        if self._content and not (ex.omit_request or ex.omit_response):
            yield from content_attributes(request, response, self._max_bytes)

    def _server(self, url: str) -> str:
        host = self._servers.get(url)
        if host is None:
            host = urlsplit(url).hostname or ""
            if len(self._servers) < 1000:
                self._servers[url] = host
        return host


def export_request(spans: list[Span]) -> ExportTraceServiceRequest:
    resource = Resource(attributes=[KeyValue(key="service.name", value=_value("flightrec"))])
    scope = ScopeSpans(spans=spans)
    scope.scope.name = "flightrec"
    return ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(resource=resource, scope_spans=[scope])]
    )


class OtlpExporter:
    """Sends a span per exchange to `otlp_endpoint`; a sink (`proxy.sinks.fanout`)."""

    def __init__(self, config: Config, dropped: Callable[[int], None] = lambda n: None) -> None:
        assert config.otlp_endpoint is not None
        self._endpoint = config.otlp_endpoint
        self._headers = {**config.otlp_headers, "Content-Type": "application/x-protobuf"}
        self._builder = SpanBuilder(config)
        self._dropped = dropped
        self._queue: deque[Exchange] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._warned_at = -WARN_EVERY
        self._resting_until = 0.0
        self._rest = RETRY_MIN
        self._stopping = False

    async def start(self) -> None:
        if self._task is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=TIMEOUT),
                connector=aiohttp.TCPConnector(limit=2),
            )
            self._task = asyncio.create_task(self._run(), name="flightrec-otlp")

    def accept(self, exchange: Exchange) -> None:
        if len(self._queue) >= QUEUE or (
            self._resting_until and time.monotonic() < self._resting_until
        ):
            self._dropped(1)
            return
        self._queue.append(exchange)
        if len(self._queue) >= BATCH:
            self._wake.set()

    async def stop(self) -> None:
        """Send what is queued (one try, bounded by `TIMEOUT` per batch), then stop."""
        if self._task is None:
            return
        self._stopping = True
        self._wake.set()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        if self._session is not None:
            await self._session.close()

    async def _run(self) -> None:
        while True:
            wait = INTERVAL if len(self._queue) < BATCH else 0.0
            wait = max(wait, self._resting_until - time.monotonic())
            if wait > 0 and not self._stopping:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
            if self._stopping and (not self._queue or self._resting_until):
                self._dropped(len(self._queue))  # the collector is down: shutdown waits for none
                self._queue.clear()
                return
            if self._queue and time.monotonic() >= self._resting_until:
                batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
                await self._send(batch)

    async def _send(self, batch: list[Exchange]) -> None:
        spans: list[Span] = []
        for ex in batch:
            try:
                spans.append(self._builder.span(ex))
            except Exception:  # a bug costs one span, never the exporter
                log.exception("exchange %s: building its span failed", ex.id)
                self._dropped(1)
        if not spans:
            return
        body = export_request(spans).SerializeToString()
        assert self._session is not None
        problem: str | None = None
        try:
            async with self._session.post(
                self._endpoint, data=body, headers=self._headers
            ) as response:
                await response.read()
                if response.status >= 300:
                    problem = f"HTTP {response.status}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if problem is None:
            self._resting_until, self._rest = 0.0, RETRY_MIN
        else:
            self._dropped(len(spans))
            now = time.monotonic()
            self._resting_until = now + self._rest
            self._rest = min(2 * self._rest, RETRY_MAX)
            if now - self._warned_at >= WARN_EVERY:
                self._warned_at = now
                log.warning(
                    "OTLP collector %s did not take %d spans (%s): dropped, with the spans of "
                    "exchanges that end in the next %.0fs; then it is tried again",
                    self._endpoint,
                    len(spans),
                    problem,
                    self._resting_until - now,
                )
