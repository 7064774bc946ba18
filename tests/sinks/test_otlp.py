"""OTLP export: a real receiver decodes what flightrec posts (ExportTraceServiceRequest,
protobuf) and checks the spans: names, GenAI attributes, the parent from `traceparent`, and
message content only when asked for and never for an omitted exchange."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from proxy.config import Config, Upstream
from proxy.relay.app import build_app, make_runner
from proxy.sinks import otlp
from proxy.sinks.fanout import MemoryRecorder
from proxy.sinks.metrics import MetricsSink
from proxy.sinks.otlp import OtlpExporter
from tests.conftest import FakeUpstream, Sdk, completion, reserved_port, start_site, until
from tests.sinks.test_metrics import USAGE

KEY = "sk-proj-otlp-test-0123456789"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
SECRET = "the secret question"
CONTENT = ("gen_ai.input.messages", "gen_ai.output.messages")


@dataclass
class Receiver:
    url: str
    spans: list[Span] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    found = Receiver("")

    async def traces(request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        export = ExportTraceServiceRequest.FromString(await request.read())
        found.headers.append(dict(request.headers))
        for resource in export.resource_spans:
            service = {a.key: a.value.string_value for a in resource.resource.attributes}
            assert service["service.name"] == "flightrec"
            for scope in resource.scope_spans:
                found.spans.extend(scope.spans)
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app)
    await runner.setup()
    found.url = await start_site(runner) + "/v1/traces"
    yield found
    await runner.cleanup()


@pytest.fixture
async def proxy_with(upstream: FakeUpstream) -> AsyncIterator[Any]:
    runners: list[web.AppRunner] = []

    async def start(**overrides: Any) -> tuple[str, MetricsSink]:
        config = replace(
            Config(),
            upstreams=(Upstream("openai", upstream.url, "/v1"),),
            **overrides,
        )
        metrics = MetricsSink(config)
        exporter = OtlpExporter(config, dropped=metrics.spans_dropped)
        app = build_app(config, MemoryRecorder(), sinks=[metrics, exporter])
        runner = make_runner(app, config)
        await runner.setup()
        runners.append(runner)
        return await start_site(runner) + "/v1", metrics

    yield start
    for runner in runners:
        await runner.cleanup()


def dropped(metrics: MetricsSink) -> float | None:
    metrics.sample()  # as a scrape does
    return metrics.registry.get_sample_value("flightrec_otlp_dropped_spans_total")


def plain(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    assert kind is not None
    if kind == "array_value":
        return [plain(v) for v in value.array_value.values]
    return getattr(value, kind)


def attributes(span: Span) -> dict[str, Any]:
    return {a.key: plain(a.value) for a in span.attributes}


async def traffic(upstream: FakeUpstream, base_url: str, sdk: Sdk) -> None:
    """A chat inside the caller's trace, a stream, an omitted chat, an upstream error."""
    upstream.completion = completion(
        id="chatcmpl-otlp1", usage=USAGE, system_fingerprint="fp_otlp", service_tier="default"
    )
    messages: Any = [{"role": "user", "content": SECRET}]
    client = sdk(base_url, KEY, max_retries=0)
    await client.chat.completions.create(
        model="gpt-4o-mini", messages=messages, extra_headers={"traceparent": TRACEPARENT}
    )
    stream = await sdk(base_url, KEY, max_retries=0).chat.completions.create(
        model="gpt-4o-mini", messages=messages, stream=True
    )
    async for _ in stream:
        pass
    await sdk(base_url, KEY, max_retries=0).chat.completions.create(
        model="gpt-4o-mini", messages=messages, extra_headers={"X-Flightrec-Omit": "request"}
    )
    with pytest.raises(openai.BadRequestError):
        await sdk(base_url, KEY, max_retries=0).chat.completions.create(
            model="gpt-4o-mini", messages=messages, stream_options={"include_usage": True}
        )


def by_kind(spans: list[Span]) -> dict[str, Span]:
    """The spans of `traffic`, told apart."""
    assert len(spans) == 4
    found: dict[str, Span] = {}
    for span in spans:
        attrs = attributes(span)
        if span.parent_span_id:
            found["child"] = span
        elif attrs["gen_ai.request.stream"]:
            found["stream"] = span
        elif "error.type" in attrs:
            found["error"] = span
        else:
            found["omitted"] = span
    assert len(found) == 4
    return found


async def test_spans_follow_the_genai_conventions_with_content_when_enabled(
    upstream: FakeUpstream, receiver: Receiver, proxy_with: Any, sdk: Sdk
) -> None:
    base_url, _ = await proxy_with(
        otlp_endpoint=receiver.url, otlp_content=True, otlp_headers={"x-api-key": "collector"}
    )
    await traffic(upstream, base_url, sdk)
    await until(lambda: len(receiver.spans) >= 4, within=10)
    spans = by_kind(receiver.spans)
    assert receiver.headers[0]["x-api-key"] == "collector"
    for kind, span in spans.items():
        # The one model name: what answered, else (the refused request) what was asked for.
        assert span.name == "chat gpt-4o-mini" + ("" if kind == "error" else "-2024-07-18")
        assert span.kind == Span.SPAN_KIND_CLIENT
        assert len(span.trace_id) == 16 and len(span.span_id) == 8
        assert span.end_time_unix_nano > span.start_time_unix_nano > 1.7e18
    child = spans["child"]
    assert child.trace_id.hex() == TRACE_ID
    assert child.parent_span_id.hex() == PARENT_ID
    assert child.span_id.hex() != PARENT_ID
    assert spans["stream"].trace_id != child.trace_id
    attrs = attributes(child)
    expected = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.response.model": "gpt-4o-mini-2024-07-18",
        "gen_ai.response.id": "chatcmpl-otlp1",
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.usage.input_tokens": 100,
        "gen_ai.usage.output_tokens": 30,
        "gen_ai.usage.cache_read.input_tokens": 40,
        "gen_ai.usage.reasoning.output_tokens": 10,
        "gen_ai.request.stream": False,
        "server.address": "127.0.0.1",
        "http.response.status_code": 200,
        "openai.response.system_fingerprint": "fp_otlp",
        "openai.response.service_tier": "default",
        "flightrec.usage_source": "reported",
    }
    assert {k: v for k, v in attrs.items() if k in expected} == expected
    assert len(attrs["flightrec.exchange_id"]) == 36
    assert attrs["flightrec.cost_usd"] > 0
    assert "error.type" not in attrs and "flightrec.ttft_ms" not in attrs
    assert orjson.loads(attrs["gen_ai.input.messages"]) == [{"role": "user", "content": SECRET}]
    assert "Héllo" in orjson.loads(attrs["gen_ai.output.messages"])[0]["content"]
    stream = attributes(spans["stream"])
    assert stream["gen_ai.request.stream"] is True
    assert stream["flightrec.ttft_ms"] > 0
    assert stream["flightrec.usage_source"] == "injected"
    assert stream["gen_ai.usage.output_tokens"] == 30
    error = attributes(spans["error"])
    assert error["error.type"] == "upstream_error"
    assert spans["error"].status.code == spans["error"].status.STATUS_CODE_ERROR
    omitted = attributes(spans["omitted"])
    assert not any(key in omitted for key in CONTENT)  # omitted: no content, whatever the config
    assert omitted["gen_ai.usage.input_tokens"] == 100  # its metadata is still there
    assert SECRET.encode() not in spans["omitted"].SerializeToString()


async def test_no_content_unless_enabled(
    upstream: FakeUpstream, receiver: Receiver, proxy_with: Any, sdk: Sdk
) -> None:
    base_url, _ = await proxy_with(otlp_endpoint=receiver.url)
    await traffic(upstream, base_url, sdk)
    await until(lambda: len(receiver.spans) >= 4, within=10)
    for span in by_kind(receiver.spans).values():
        assert not any(key in attributes(span) for key in CONTENT)
        assert SECRET.encode() not in span.SerializeToString()


async def test_a_collector_that_is_down_costs_spans_not_requests(
    upstream: FakeUpstream,
    proxy_with: Any,
    sdk: Sdk,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(otlp, "INTERVAL", 0.05)
    with reserved_port() as port:  # bound, not listening: every export is refused
        base_url, metrics = await proxy_with(otlp_endpoint=f"http://127.0.0.1:{port}/v1/traces")
        with caplog.at_level(logging.WARNING, logger="proxy.sinks.otlp"):
            for _ in range(3):
                answer = await sdk(base_url, KEY, max_retries=0).chat.completions.create(
                    model="gpt-4o-mini", messages=[]
                )
                assert answer.choices[0].message.content
                await until(lambda: (dropped(metrics) or 0) >= 1, within=10)
            await until(lambda: dropped(metrics) == 3, within=10)
    warnings = [r for r in caplog.records if r.name == "proxy.sinks.otlp"]
    assert len(warnings) == 1  # one warning a minute, not one per export
    assert "did not take" in warnings[0].getMessage()
