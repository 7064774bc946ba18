"""The bench harness, run for real at toy sizes: mock upstream, bare relay and flightrec (with
the in-memory recorder) as child processes, the load generator in its own process. Checks that
the parts work together and the figures come out sane, never how fast anything is."""

from __future__ import annotations

import asyncio
import math
import re
import signal
import socket
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench import __main__ as bench_main
from bench import first_byte, load, procs, report
from bench.__main__ import RESTARTS, Plan, alive, paired_groups, quiet_machine, run
from bench.upstream import MockProtocol
from tests.conftest import reserved_port

TINY = Plan(
    rounds=1,
    seconds=10.0,  # a cap never reached: the counts are what is checked
    requests=300,
    ttfb_chunks=4,
    ttfb_interval_ms=0.0,
    streams=6,
    stream_chunks=10,
    stream_interval_ms=5.0,
    streams_rounds=1,
)


@pytest.mark.parametrize("c1", ["paired", "solo"])
def test_harness_runs_end_to_end(tmp_path: Path, c1: str) -> None:
    names = ["direct", "relay", "flightrec-memory"]
    measures = ["latency", "ttfb", "cpu", "cpu-64", "cpu-large", "streams"]
    results = run(replace(TINY, c1=c1), names, measures, tmp_path, pg="", install=False)

    raw = results["raw"]
    for measure in ("latency", "ttfb", "cpu", "cpu-64", "cpu-large"):
        for name in names:
            (result,) = raw[measure][name]
            assert result["errors"] == 0, (measure, name, result)
            assert result["ok"] == TINY.requests, (measure, name, result)
    # The mock alone answers sooner than through a relay: rows belong to the right targets.
    for measure in ("latency", "ttfb"):
        p50 = {name: raw[measure][name][0]["latency_p50_ms"] for name in names}
        assert p50["direct"] < p50["relay"], (measure, p50)
    # Paired, the targets' requests alternated: each row carries direct's figures of that run.
    for measure, key in (("latency", "latency_p50_ms"), ("ttfb", "ttfb_p50_ms")):
        (direct,) = raw[measure]["direct"]
        for name in names[1:]:
            ref = raw[measure][name][0].get("ref")
            if c1 == "paired":
                assert ref is not None and ref[key] == direct[key]
            else:
                assert ref is None
    for name in names:
        (streams,) = raw["streams"][name]
        assert streams["ok"] == TINY.streams and streams["errors"] == 0, streams
        assert streams["events_min"] == TINY.stream_chunks + 1  # the chunks, then [DONE]
    assert raw["streams"]["flightrec-memory"][0]["recorded"] == TINY.streams

    summary = results["summary"]
    for name in ("relay", "flightrec-memory"):
        # Figures only: CPU time comes in 10 ms ticks (300 requests may not move it on a fast
        # machine) and an added latency is a difference that noise can make negative.
        for metric in ("cpu_us", "cpu64_us", "cpu_large_us"):
            assert math.isfinite(summary[name][metric]) and summary[name][metric] >= 0
        for metric in ("added_p50_ms", "added_ttfb_p50_ms"):
            assert math.isfinite(summary[name][metric])
        assert math.isfinite(summary[name]["cpu_per_chunk_us"])
    assert summary["relay"]["cpu_us_x"] == 1.0
    assert math.isfinite(summary["flightrec-memory"]["cpu_us_x"])
    assert "| flightrec-memory |" in report.markdown(results)
    assert all(t["crashes"] == [] for t in results["targets"].values())
    results["targets"]["relay"]["crashes"] = [-11]
    assert "- relay: 1 time(s), exit statuses [-11]" in report.markdown(results)


def test_the_large_request_carries_the_extra_prompt() -> None:
    head, _, body = load.request_bytes(8080, "/v1/chat/completions", False, 50_000).partition(
        b"\r\n\r\n"
    )
    payload = orjson.loads(body)
    assert f"Content-Length: {len(body)}".encode() in head
    assert len(payload["messages"][-1]["content"]) == 50_000
    assert payload["messages"][:-1] == load.REQUEST_BODY["messages"]
    assert (
        orjson.loads(
            load.request_bytes(8080, "/v1/chat/completions", False).partition(b"\r\n\r\n")[2]
        )["messages"]
        == load.REQUEST_BODY["messages"]
    )


def test_the_bench_waits_for_a_quiet_machine_but_not_for_ever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The machine's own load cannot be set from a test: /proc/stat's busy share is played
    # back instead, a window busy 90 %, then 50 %, then 10 %.
    jiffies = iter([(0, 0), (90, 100), (90, 100), (140, 200), (140, 200), (150, 300)])
    monkeypatch.setattr(bench_main, "_busy_jiffies", lambda: next(jiffies))
    quiet = quiet_machine(limit=0.15, window=0.01, timeout=5.0)
    assert quiet["quiet"] and quiet["busy"] == 0.1
    assert next(jiffies, None) is None  # waited through all three windows, no more
    monkeypatch.undo()

    # On the real /proc/stat: any machine is at most 100 % busy; none is below 0 %.
    assert quiet_machine(limit=1.0, window=0.1, timeout=5.0)["quiet"]
    never = quiet_machine(limit=-1.0, window=0.1, timeout=0.5)
    assert not never["quiet"] and 0.5 <= never["waited_s"] < 10  # gave up after its timeout
    assert 0.0 <= never["busy"] <= 1.0
    stored = orjson.loads((Path(__file__).parents[1] / "bench" / "results.json").read_bytes())
    assert "had not gone quiet" in report.markdown({**stored, "quiet": never})
    assert "the machine was quiet" in report.markdown({**stored, "quiet": quiet})


def test_a_target_that_dies_is_started_again(tmp_path: Path) -> None:
    with reserved_port() as port:  # held all along: the peer starts again on it (SO_REUSEADDR)
        server = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
        target = procs.Target("peer", "a peer that crashes", server, port, ready_path="/")
        procs.start(target, tmp_path)
        try:
            procs.wait_ready(target)
            assert target.process is not None
            target.process.kill()
            target.process.wait(5)
            assert alive(target)  # started again, and answering
            assert target.crashes == [-signal.SIGKILL]
            assert target.process.poll() is None
            for _ in range(RESTARTS):
                target.process.kill()
                target.process.wait(5)
                alive(target)
            assert not alive(target)  # given up after RESTARTS
            assert target.skipped and "exited during the bench" in target.skipped
        finally:
            procs.stop(target)


def test_slow_targets_are_paired_with_direct_alone() -> None:
    named = [procs.Target(n, n, [], 0) for n in ("direct", "relay", "litellm", "nginx")]
    groups = [[t.name for t in group] for group in paired_groups(named)]
    assert groups == [["direct", "relay", "nginx"], ["direct", "litellm"]]
    assert paired_groups(named[:1]) == []  # direct alone is compared with nothing


def test_added_figures_are_taken_against_the_direct_run_beside_them() -> None:
    key = "latency_p50_ms"
    raw: dict[str, list[dict[str, Any]]] = {
        "direct": [{"round": 0, "ok": 1, key: 0.2}],
        "relay": [{"round": 0, "ok": 1, key: 1.0, "ref": {key: 0.3}}],
        "litellm": [{"round": 0, "ok": 1, key: 20.0, "ref": {}}],  # its direct answered nothing
        "nginx": [{"round": 0, "ok": 1, key: 0.5}],  # solo: against the round's direct
    }
    assert report._added(raw, "relay", key) == 1.0 - 0.3
    assert report._added(raw, "litellm", key) is None
    assert report._added(raw, "nginx", key) == 0.5 - 0.2


def test_the_first_byte_targets_judge_each_pattern_against_its_relay() -> None:
    key = "ttfb_p50_ms"
    # Per round: back to back relay/ours, 5 ms apart relay/ours. The median of the per-round
    # differences is not the difference of the medians (+90 and +230 µs here).
    rounds = [(0.30, 0.38, 0.70, 0.95), (0.50, 0.56, 0.90, 1.05), (0.31, 0.40, 0.72, 0.84)]
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {"ttfb-b2b": {}, "ttfb-gap": {}}
    for i, (b2b_relay, b2b, gap_relay, gap) in enumerate(rounds):
        for measure, relay, ours in (("ttfb-b2b", b2b_relay, b2b), ("ttfb-gap", gap_relay, gap)):
            raw[measure].setdefault("relay", []).append({"round": i, "ok": 9, key: relay})
            raw[measure].setdefault("flightrec-sqlite", []).append({"round": i, "ok": 9, key: ours})
    raw["ttfb-b2b"]["flightrec-postgres"] = [{"round": 0, "ok": 9, key: 0.33}]  # not run apart
    names = ["relay", "flightrec-sqlite", "flightrec-postgres"]
    results = {"raw": raw, "summary": report.summarize(raw, names)}
    verdicts = dict(report.checks(results))
    back_to_back = verdicts["first byte p50 within 0.1 ms of the relay's, back to back"]
    apart = verdicts["first byte p50 within 0.1 ms of the relay's, 5 ms apart"]
    assert back_to_back["flightrec-sqlite"] == "PASS (+80 µs)"  # of +80, +60, +90
    assert apart["flightrec-sqlite"] == "FAIL (+150 µs)"  # of +250, +150, +120
    assert back_to_back["flightrec-postgres"] == "PASS (+30 µs)"
    assert apart["flightrec-postgres"] == "n/a"


async def test_a_target_that_refuses_costs_only_its_own_requests() -> None:
    server = await asyncio.get_running_loop().create_server(MockProtocol, "127.0.0.1", 0)
    live = server.sockets[0].getsockname()[1]
    try:
        with reserved_port() as dead:  # nothing listens there
            cmd = {"ports": [live, dead], "path": "/v1/chat/completions", "requests": 20}
            result = await load.paired_loop({**cmd, "seconds": 10.0, "warmup": 2})
    finally:
        server.close()
    answered, refused = result["results"]
    assert (answered["ok"], answered["errors"]) == (20, 0)
    assert (refused["ok"], refused["errors"]) == (0, 20)
    assert refused["error_kinds"] == {"ConnectionRefusedError": 20}


def test_first_byte_reports_each_process_and_each_checkout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = [
        {"relay": 0.5, "this-0": 0.6, "this-1": 0.62, "base-0": 0.7},
        {"relay": 0.4, "this-0": 0.5, "this-1": 0.54, "base-0": 0.52},
        {"relay": 0.5, "this-0": 0.58, "this-1": 0.6, "base-0": 0.66},
    ]
    lines = first_byte.report(rows, ["this-0", "this-1", "base-0"])
    assert lines == [
        "this-0: +0.100 ms over the relay",
        "this-1: +0.120 ms over the relay",
        "base-0: +0.160 ms over the relay",
        "base (mean of 1): +0.160 ms",
        "this (mean of 2): +0.110 ms",
    ]
    # And for real, at a toy size: the relay, one process of this checkout and one of a base.
    assert first_byte.main(["--processes", "1", "--base", str(procs.ROOT), "--rounds", "1",
                            "--seconds", "1"]) == 0  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert re.match(r"round 1: relay \d+\.\d{3}  this-0 \d+\.\d{3}  base-0 \d+\.\d{3}$", out[0])
    assert re.match(r"this \(mean of 1\): [+-]\d+\.\d{3} ms$", out[-1])
    # Each process alone in turn.
    assert first_byte.main(["--processes", "1", "--alone", "--rounds", "1", "--seconds", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert re.match(r"round 1: relay \d+\.\d{3}  this-0 \d+\.\d{3}$", out[0])


def test_a_server_of_several_processes_is_waited_for_until_each_listens(tmp_path: Path) -> None:
    """`serve --workers N` answers once its first worker listens; the scale bench waits for
    all N, counted from /proc/net/tcp as the listening sockets sharing the port (a connection
    accepted on that port is not one), and stops waiting for a target that has exited."""

    def listener(port: int) -> socket.socket:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()
        return sock

    first = listener(0)
    port = first.getsockname()[1]
    # A connection whose local port is the listeners' too, accepted while `first` is the only
    # listener (past that the kernel may queue it at any of them).
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = first.accept()
    others = [listener(port), listener(port)]
    try:
        assert procs.listening(port) == 3
        procs.wait_listening(port, 3, timeout=1.0)
        others.pop().close()
        assert procs.listening(port) == 2
        began = time.monotonic()
        with pytest.raises(RuntimeError, match=f"2 of 3 listening on {port}"):
            procs.wait_listening(port, 3, timeout=0.3)
        assert time.monotonic() - began >= 0.3
        dead = procs.Target("dead", "exits at once", [sys.executable, "-c", "exit(3)"], port)
        procs.start(dead, tmp_path)
        assert dead.process is not None
        dead.process.wait(10)
        with pytest.raises(RuntimeError, match="dead exited with 3"):
            procs.wait_listening(port, 3, [dead], timeout=30.0)
    finally:
        for sock in [client, accepted, first, *others]:
            sock.close()
    assert procs.listening(port) == 0
