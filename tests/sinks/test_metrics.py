"""`GET /metrics` after known traffic: every counter of SPEC section 9 has its exact value, in
one process (a real SQLite recorder behind it) and summed over `serve --workers 2`."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from proxy.config import Config, Upstream
from proxy.console import build_console
from proxy.relay.app import build_app, make_runner
from proxy.sinks.metrics import MetricsSink
from proxy.store.migrate import upgrade
from proxy.store.recorder import DatabaseRecorder
from tests.conftest import FakeUpstream, Sdk, completion, reserved_port, start_site, wait_until_up

KEY = "sk-proj-metrics-test-0123456789"
TOKEN = "metrics-console-token-42"
USAGE = {
    "prompt_tokens": 100,
    "completion_tokens": 30,
    "total_tokens": 130,
    "prompt_tokens_details": {"cached_tokens": 40},
    "completion_tokens_details": {"reasoning_tokens": 10},
}
PRICES = {"metered": {"input": 1.0, "cached_input": 0.5, "output": 2.0}}
COST = (60 * 1.0 + 40 * 0.5 + 30 * 2.0) / 1e6
"""One priced exchange: 60 uncached, 40 cached, 30 output tokens at USD per 1M tokens."""

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def series(samples: Samples, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """The series of `name` that counted something (a series at 0 is as good as none)."""
    return {labels: v for (n, labels), v in samples.items() if n == name and v}


async def scrape(console: str, token: str | None = TOKEN) -> Samples:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as session,
        session.get(console + "/metrics", headers=headers) as response,
    ):
        assert response.status == 200, await response.text()
        assert response.content_type == "text/plain"
        return parse(await response.text())


async def scrape_until(console: str, name: str, wanted: float, within: float = 15) -> Samples:
    """Scrape until counter `name` (no labels) reaches `wanted`: the recorder's health is
    sampled every second and the record is written in the background."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        samples = await scrape(console)
        if value(samples, name) == wanted:
            return samples
        assert asyncio.get_running_loop().time() < deadline, (name, value(samples, name))
        await asyncio.sleep(0.2)


@dataclass
class Running:
    base_url: str
    console: str
    metrics: MetricsSink


@pytest.fixture
async def running(upstream: FakeUpstream, tmp_path: Path) -> AsyncIterator[Any]:
    runners: list[web.AppRunner] = []

    async def start(**overrides: Any) -> Running:
        db_url = f"sqlite+aiosqlite:///{tmp_path / f'metrics{len(runners)}.db'}"
        await upgrade(db_url)
        config = replace(
            Config(),
            upstreams=(Upstream("openai", upstream.url, "/v1"),),
            db_url=db_url,
            spool_path=str(tmp_path / f"metrics{len(runners)}.spool"),
            batch_interval=0.01,
            console_token=TOKEN,
            prices=PRICES,
            **overrides,
        )
        recorder = DatabaseRecorder(config)
        metrics = MetricsSink(config, recorder)
        app = build_app(config, recorder, sinks=[metrics])
        runner = make_runner(app, config)
        await runner.setup()
        runners.append(runner)
        console_runner = web.AppRunner(build_console(config, metrics))
        await console_runner.setup()
        runners.append(console_runner)
        base = await start_site(runner) + "/v1"
        return Running(base, await start_site(console_runner), metrics)

    yield start
    for runner in reversed(runners):
        await runner.cleanup()


async def send_known_traffic(
    upstream: FakeUpstream, base_url: str, sdk: Sdk, fingerprints: tuple[str, str]
) -> None:
    """2 priced chats (one streamed; the first answered with `fingerprints[0]`, the rest with
    `fingerprints[1]`), 1 unpriced chat, 1 upstream error, 1 stream the client leaves after
    its first event; a fresh client (and connection) per call."""
    first, then = fingerprints
    upstream.completion = completion(model="metered", usage=USAGE, system_fingerprint=first)
    messages: Any = [{"role": "user", "content": "hi"}]
    await sdk(base_url, KEY, max_retries=0).chat.completions.create(
        model="metered", messages=messages
    )
    upstream.completion = completion(model="metered", usage=USAGE, system_fingerprint=then)
    stream = await sdk(base_url, KEY, max_retries=0).chat.completions.create(
        model="metered", messages=messages, stream=True
    )
    async for _ in stream:
        pass
    upstream.completion = completion(model="mystery-model", usage=USAGE, system_fingerprint=None)
    await sdk(base_url, KEY, max_retries=0).chat.completions.create(
        model="mystery-model", messages=messages
    )
    with pytest.raises(openai.BadRequestError):  # the fake refuses stream_options without stream
        await sdk(base_url, KEY, max_retries=0).chat.completions.create(
            model="metered", messages=messages, stream_options={"include_usage": True}
        )
    upstream.completion = completion(model="metered", usage=USAGE, system_fingerprint=then)
    upstream.by_event, upstream.pause = True, 0.2
    stream = await sdk(base_url, KEY, max_retries=0).chat.completions.create(
        model="metered", messages=messages, stream=True
    )
    async for _ in stream:
        break  # the client leaves while the upstream is still sending
    await stream.close()
    upstream.by_event, upstream.pause = False, 0.0


def labels(**values: str) -> frozenset[tuple[str, str]]:
    return frozenset({"upstream": "openai", **values}.items())


def check_counters(samples: Samples, times: int = 1, fingerprint_changes: int = 1) -> None:
    """The exact value of every counter after `times` rounds of `send_known_traffic`."""
    assert series(samples, "flightrec_requests_total") == {
        labels(model="metered", outcome="ok", status_class="2xx"): 2 * times,
        labels(model="mystery-model", outcome="ok", status_class="2xx"): times,
        labels(model="metered", outcome="upstream_error", status_class="4xx"): times,
        labels(model="metered", outcome="client_disconnected", status_class="2xx"): times,
    }
    expected_tokens: dict[frozenset[tuple[str, str]], float] = {}
    for model, priced in (("metered", 2 * times), ("mystery-model", times)):
        for kind, count in (
            ("input", 60),
            ("cached_input", 40),
            ("output", 30),
            ("reasoning_output", 10),
        ):
            expected_tokens[labels(model=model, type=kind)] = count * priced
    assert series(samples, "flightrec_tokens_total") == expected_tokens
    cost = series(samples, "flightrec_cost_usd_total")
    assert list(cost) == [labels(model="metered")]
    assert cost[labels(model="metered")] == pytest.approx(2 * times * COST, rel=1e-9)
    # The stream the client left had no usage yet: unpriced, as the cost report counts it.
    assert series(samples, "flightrec_unpriced_requests_total") == {
        labels(model="mystery-model"): times,
        labels(model="metered"): times,
    }
    assert series(samples, "flightrec_fingerprint_changes_total") == {
        labels(model="metered"): fingerprint_changes
    }
    assert value(samples, "flightrec_records_written_total") == 5 * times
    assert value(samples, "flightrec_records_spooled_total") == 5 * times
    assert value(samples, "flightrec_otlp_dropped_spans_total") == 0
    durations = series(samples, "flightrec_request_duration_seconds_count")
    assert durations == {
        labels(model="metered", stream="false"): 2 * times,
        labels(model="metered", stream="true"): 2 * times,
        labels(model="mystery-model", stream="false"): times,
    }
    assert series(samples, "flightrec_upstream_ttfb_seconds_count") == {labels(): 5 * times}
    ttft = series(samples, "flightrec_time_to_first_token_seconds_count")
    assert list(ttft) == [labels(model="metered")]
    assert times <= ttft[labels(model="metered")] <= 2 * times  # the left one may have none
    assert value(samples, "flightrec_database_up") == 1


async def test_metrics_after_known_traffic(upstream: FakeUpstream, running: Any, sdk: Sdk) -> None:
    proxy: Running = await running()
    await send_known_traffic(upstream, proxy.base_url, sdk, ("fp_a", "fp_b"))
    samples = await scrape_until(proxy.console, "flightrec_records_written_total", 5)
    check_counters(samples)
    assert value(samples, "flightrec_record_queue_depth") == 0
    spool = value(samples, "flightrec_spool_bytes")
    assert spool is not None and spool > 0  # the journal's committed segment stays until sealed


def test_the_dashboard_reads_only_metrics_flightrec_serves() -> None:
    dashboard = json.loads((Path(__file__).parents[2] / "docs/grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    named = {
        re.sub(r"_bucket$", "", name) for e in exprs for name in re.findall(r"flightrec_\w+", e)
    }
    served = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in MetricsSink(Config()).registry.collect()
    }
    assert named <= served, named - served
    assert len(named) >= 12


async def test_metrics_need_the_console_token(running: Any) -> None:
    proxy: Running = await running()
    async with (
        aiohttp.ClientSession() as session,
        session.get(proxy.console + "/metrics") as response,
    ):
        assert response.status == 401
    samples = await scrape(proxy.console)
    assert value(samples, "flightrec_database_up") == 1


async def test_user_and_key_labels_only_when_configured(
    upstream: FakeUpstream, running: Any, sdk: Sdk
) -> None:
    plain: Running = await running()
    labelled: Running = await running(metrics_labels=("user", "key"))
    upstream.completion = completion(model="metered", usage=USAGE)
    for proxy in (plain, labelled):
        await sdk(proxy.base_url, KEY, max_retries=0).chat.completions.create(
            model="metered", messages=[], extra_headers={"X-Flightrec-User": "ann"}
        )
    samples = await scrape_until(plain.console, "flightrec_records_written_total", 1)
    assert all(
        {k for k, _ in labels} == {"upstream", "model", "outcome", "status_class"}
        for labels in series(samples, "flightrec_requests_total")
    )
    samples = await scrape_until(labelled.console, "flightrec_records_written_total", 1)
    (labels,) = series(samples, "flightrec_requests_total")
    found = dict(labels)
    assert found["user"] == "ann"
    assert len(found["key"]) == 16 and KEY not in found["key"]  # the key's hash, never the key
    for name in ("flightrec_tokens_total", "flightrec_cost_usd_total"):
        assert all(dict(labels)["user"] == "ann" for labels in series(samples, name))
    assert all(
        "user" not in dict(labels)
        for labels in series(samples, "flightrec_unpriced_requests_total")
    )


async def test_serve_with_two_workers_sums_their_metrics(
    upstream: FakeUpstream, tmp_path: Path, sdk: Sdk
) -> None:
    db = tmp_path / "workers.db"
    config = tmp_path / "flightrec.toml"
    config.write_text('[prices."metered"]\ninput = 1.0\ncached_input = 0.5\noutput = 2.0\n')
    rounds = 6
    with reserved_port() as port, reserved_port() as console_port:
        env = {
            **os.environ,
            "FLIGHTREC_SPOOL_PATH": str(tmp_path / "spool"),
            "FLIGHTREC_CONSOLE_PORT": str(console_port),
            "FLIGHTREC_CONSOLE_TOKEN": TOKEN,
            "FLIGHTREC_BATCH_INTERVAL": "0.01",
        }
        log = (tmp_path / "serve.log").open("wb")
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", "serve", "--config", str(config),
            "--port", str(port), "--upstream", upstream.url, "--db", f"sqlite+aiosqlite:///{db}",
            "--workers", "2",
            env=env, stdout=log, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        base = f"http://127.0.0.1:{port}"
        console = f"http://127.0.0.1:{console_port}"
        try:
            await wait_until_up(base + "/readyz", process)
            await wait_until_up(console + "/static/console.css", process)
            # A fresh connection per request, so both workers serve both halves: each sees
            # fp_a, then fp_b, and counts that one change.
            for fingerprints in [("fp_a", "fp_a")] * rounds + [("fp_b", "fp_b")] * rounds:
                await send_known_traffic(upstream, base + "/v1", sdk, fingerprints)
            samples = await scrape_until(console, "flightrec_records_written_total", 10 * rounds)
        finally:
            process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(process.wait(), 60)
    check_counters(samples, times=2 * rounds, fingerprint_changes=2)


async def test_a_named_key_is_labelled_by_its_name(
    upstream: FakeUpstream, running: Any, sdk: Sdk
) -> None:
    hint = f"{KEY[:3]}...{KEY[-4:]}"
    named: Running = await running(metrics_labels=("key",), keys={hint: "ci-bot"})
    upstream.completion = completion(model="metered", usage=USAGE)
    await sdk(named.base_url, KEY, max_retries=0).chat.completions.create(
        model="metered", messages=[]
    )
    samples = await scrape_until(named.console, "flightrec_records_written_total", 1)
    (labels,) = series(samples, "flightrec_requests_total")
    assert dict(labels)["key"] == "ci-bot"


@pytest.mark.parametrize(
    "values",
    [
        [0.0, 0.025, 0.0251, 0.3, 1.5, 29.9, 30.0, 31.0, float("inf"), -1.0, float("nan")],
        [0.0, 0.125, 0.5, 1.5, 2.0, 3.0, 30.0, 31.0, -1.0],  # sums exact in binary
    ],
)
def test_held_timings_reach_the_histogram_as_observe_puts_them(values: list[float]) -> None:
    """A series holds its timings between samples; once flushed, the histogram says what
    `observe` would have made of each value: the same buckets (a value on a bound in that
    bound's, NaN in none, beyond the last bound in +Inf), the same count and sum."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from proxy.sinks.metrics import FIRST_BYTE_SECONDS
    from proxy.sinks.timings import HeldTimings

    made = []
    for _ in range(2):
        registry = CollectorRegistry(auto_describe=False)
        histogram = Histogram("t", "t", ["a"], buckets=FIRST_BYTE_SECONDS, registry=registry)
        made.append((registry, histogram.labels("x")))
    (observed, child), (held, timing_child) = made
    timing = HeldTimings(timing_child, FIRST_BYTE_SECONDS)
    for _ in range(2):  # twice: a flush starts the next round from nothing
        for value in values:
            child.observe(value)
            timing.observe(value)
        assert generate_latest(held) != generate_latest(observed)
        timing.flush()
        timing.flush()  # nothing held: nothing added
        assert generate_latest(held) == generate_latest(observed)


def test_held_timings_observe_at_once_where_the_histogram_holds_no_buckets() -> None:
    """A prometheus_client whose histograms keep their values elsewhere still gets each value
    (through `observe`), not a flush that would fail on the first sample."""
    from proxy.sinks.metrics import FIRST_BYTE_SECONDS
    from proxy.sinks.timings import HeldTimings

    class OtherHistogram:
        def __init__(self) -> None:
            self.seen: list[float] = []

        def observe(self, amount: float) -> None:
            self.seen.append(amount)

    other = OtherHistogram()
    timing = HeldTimings(other, FIRST_BYTE_SECONDS)  # type: ignore[arg-type]
    timing.observe(0.3)
    timing.flush()
    assert other.seen == [0.3]
