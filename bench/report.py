"""From the raw per-round results to medians, ratios to the relay, verdicts and markdown."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import sqlite3
import statistics
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Summary = dict[str, dict[str, Any]]

RATIO_METRICS = (
    "cpu_us",
    "cpu64_us",
    "cpu_large_us",
    "added_p50_ms",
    "added_p99_ms",
    "added_ttfb_p50_ms",
    "max_rate",
    "rss_per_stream_kib",
    "cpu_per_chunk_us",
)
RECORDING = ("flightrec-sqlite", "flightrec-postgres", "base-sqlite", "base-postgres")
LITELLM_VENV = Path(__file__).resolve().parent / ".litellm-venv"


C1_WORDS = {
    "paired": "the targets' requests alternated",
    "solo": "each target in turn, requests back to back",
}


def _median(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def _ok(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if "failed" not in r and r.get("ok")]


def _added(raw: dict[str, list[dict[str, Any]]], name: str, key: str) -> float | None:
    """Median over rounds of (target - direct) for `key`, each round against the direct figure
    measured beside it (`ref`, from the same paired run), else against that round's direct. A
    paired row whose direct figure is missing is left out, never set against another run."""
    direct = {r["round"]: r[key] for r in _ok(raw.get("direct", [])) if key in r}
    added = []
    for row in _ok(raw.get(name, [])):
        ref = row.get("ref")
        reference = direct.get(row["round"]) if ref is None else ref.get(key)
        if key in row and reference is not None:
            added.append(row[key] - reference)
    return _median(added)


def _over_relay(raw: dict[str, list[dict[str, Any]]], name: str, key: str) -> float | None:
    """Median over rounds of (target - relay) for `key`, each round against that round's relay."""
    relay = {r["round"]: r[key] for r in _ok(raw.get("relay", [])) if key in r}
    return _median(
        row[key] - relay[row["round"]]
        for row in _ok(raw.get(name, []))
        if key in row and row["round"] in relay
    )


def _cpu_per_request_us(rows: list[dict[str, Any]]) -> float | None:
    # A round in which the target died measured part of a process: not a CPU figure.
    clean = [r for r in rows if "cpu_s" in r and not r.get("errors")]
    return _median(r["cpu_s"] / r["ok"] * 1e6 for r in clean)


def summarize(raw: dict[str, Any], names: list[str]) -> Summary:
    out: Summary = {}
    for name in names:
        s: dict[str, Any] = {}
        latency = raw.get("latency", {})
        if name in latency:
            rows = _ok(latency[name])
            s["lat_p50_ms"] = _median(r["latency_p50_ms"] for r in rows)
            s["lat_p99_ms"] = _median(r["latency_p99_ms"] for r in rows)
            s["added_p50_ms"] = _added(latency, name, "latency_p50_ms")
            s["added_p99_ms"] = _added(latency, name, "latency_p99_ms")
            s["latency_errors"] = sum(r.get("errors", 0) for r in latency[name])
        ttfb = raw.get("ttfb", {})
        if name in ttfb:
            rows = _ok(ttfb[name])
            s["ttfb_p50_ms"] = _median(r.get("ttfb_p50_ms") for r in rows)
            s["added_ttfb_p50_ms"] = _added(ttfb, name, "ttfb_p50_ms")
            s["added_ttfb_p99_ms"] = _added(ttfb, name, "ttfb_p99_ms")
            s["ttfb_errors"] = sum(r.get("errors", 0) for r in ttfb[name])
        for measure, label in (("ttfb-b2b", "b2b"), ("ttfb-gap", "gap")):
            if name in raw.get(measure, {}):
                rows = _ok(raw[measure][name])
                s[f"{label}_ttfb_p50_ms"] = _median(r.get("ttfb_p50_ms") for r in rows)
                s[f"{label}_over_relay_ms"] = _over_relay(raw[measure], name, "ttfb_p50_ms")
        cpu = raw.get("cpu", {})
        if name in cpu:
            rows = _ok(cpu[name])
            s["rps_c8"] = _median(r["rps"] for r in rows)
            s["cpu_us"] = _cpu_per_request_us(rows)
            s["rss_kib"] = _median(r.get("rss_kib") for r in rows)
            s["cpu_errors"] = sum(r.get("errors", 0) for r in cpu[name])
        many = raw.get("cpu-64", {})
        if name in many:
            s["cpu64_us"] = _cpu_per_request_us(_ok(many[name]))
            s["cpu_errors"] = s.get("cpu_errors", 0) + sum(r.get("errors", 0) for r in many[name])
        large = raw.get("cpu-large", {})
        if name in large:
            s["cpu_large_us"] = _cpu_per_request_us(_ok(large[name]))
            s["cpu_errors"] = s.get("cpu_errors", 0) + sum(r.get("errors", 0) for r in large[name])
        maxrate = raw.get("maxrate", {})
        if name in maxrate:
            s["max_rate"] = _median(r["max_rate"] for r in maxrate[name])
        streams = raw.get("streams", {})
        if name in streams:
            rows = streams[name]
            s["streams"] = sum(r.get("count", 0) for r in rows)
            s["streams_ok"] = sum(r.get("ok", 0) for r in rows)
            s["stream_errors"] = s["streams"] - s["streams_ok"]
            s["most_open"] = min((r.get("most_open", 0) for r in rows), default=0)
            kinds: set[str] = set().union(*(r.get("error_kinds", {}) for r in rows))
            s["stream_error_kinds"] = sorted(kinds)
            s["streams_ttfb_p50_ms"] = _median(r.get("ttfb_p50_ms") for r in rows)
            s["streams_ttfb_p99_ms"] = _median(r.get("ttfb_p99_ms") for r in rows)
            if any("recorded" in r for r in rows):
                s["recorded"] = sum(r.get("recorded", 0) for r in rows)
            # Python keeps the heap it grew, so a later round reads less: the first (largest)
            # growth is the honest one.
            grown = [r["rss_per_stream_kib"] for r in rows if "rss_per_stream_kib" in r]
            s["rss_per_stream_kib"] = max(grown) if grown else None
            s["cpu_per_chunk_us"] = _median(r.get("cpu_per_chunk_us") for r in rows)
        if name == "direct":  # the reference for every "added" figure
            s = {k: v for k, v in s.items() if not k.startswith("added_")}
        out[name] = s
    relay = out.get("relay", {})
    for s in out.values():
        for metric in RATIO_METRICS:
            value, floor = s.get(metric), relay.get(metric)
            if value is not None and floor:
                s[metric + "_x"] = value / floor
    return out


def checks(results: dict[str, Any]) -> list[tuple[str, dict[str, str]]]:
    """The targets (the issue's and ours), one row each, a verdict per recording target."""
    summary: Summary = results.get("summary", {})
    relay = summary.get("relay", {})
    litellm = summary.get("litellm", {})
    reassembly = results.get("reassembly", {}).get("rows", [])
    rows: list[tuple[str, dict[str, str]]] = []

    def verdict(ok: bool | None, detail: str) -> str:
        return "n/a" if ok is None else ("PASS" if ok else "FAIL") + f" ({detail})"

    def row(label: str, judge: Any) -> None:
        rows.append((label, {n: judge(summary[n]) for n in RECORDING if n in summary}))

    def at_most(key: str, most: float) -> Any:
        def judge(s: dict[str, Any]) -> str:
            x = s.get(key + "_x")
            return verdict(None if x is None else x <= most, f"{x:.2f}x" if x else "")

        return judge

    def at_most_2x(key: str) -> Any:
        return at_most(key, 2)

    def cpu_litellm(s: dict[str, Any]) -> str:
        ours, theirs = s.get("cpu_us"), litellm.get("cpu_us")
        if not ours or not theirs:
            return "n/a (LiteLLM not measured)"
        return verdict(theirs / ours >= 30, f"{theirs / ours:.1f}x less")

    def tenth_of_a_ms(over: float | None) -> str:
        return "n/a" if over is None else verdict(over <= 0.1, f"{over * 1000:+.0f} µs")

    def within(key: str) -> Any:
        def judge(s: dict[str, Any]) -> str:
            ours, floor = s.get(key), relay.get(key)
            return tenth_of_a_ms(None if ours is None or floor is None else ours - floor)

        return judge

    def over_relay(key: str) -> Any:
        return lambda s: tenth_of_a_ms(s.get(key))

    def streams_clean(s: dict[str, Any]) -> str:
        if "streams" not in s:
            return "n/a"
        detail = f"{s['stream_errors']} errors of {s['streams']}"
        return verdict(s["stream_errors"] == 0, detail)

    def streams_recorded(s: dict[str, Any]) -> str:
        if "recorded" not in s:
            return "n/a"
        return verdict(s["recorded"] >= s["streams"], f"{s['recorded']}/{s['streams']}")

    def rss(s: dict[str, Any]) -> str:
        kib = s.get("rss_per_stream_kib")
        return verdict(None if kib is None else kib <= 64, f"{kib:.1f} KiB" if kib else "")

    def reassembled(s: dict[str, Any]) -> str:
        if not reassembly:
            return "n/a"
        worst = max(r["flightrec_us"] for r in reassembly)
        return verdict(worst <= 10, f"{worst:.2f} µs/chunk")

    row("CPU per request <= 2x the bare relay's (c=8)", at_most_2x("cpu_us"))
    row("CPU per request <= 1.3x the bare relay's (c=8, issue 36)", at_most("cpu_us", 1.3))
    row("CPU per request <= 1.3x the bare relay's (c=64, issue 36)", at_most("cpu64_us", 1.3))
    row("CPU per request >= 30x less than LiteLLM's", cpu_litellm)
    row("(ours) CPU per 50 KB request <= 2x the bare relay's (c=8)", at_most_2x("cpu_large_us"))
    row("added latency p50 within 0.1 ms of the relay's (c=1)", within("added_p50_ms"))
    row("added TTFB p50 within 0.1 ms of the relay's (streams)", within("added_ttfb_p50_ms"))
    row(
        "first byte p50 within 0.1 ms of the relay's, back to back", over_relay("b2b_over_relay_ms")
    )
    row("first byte p50 within 0.1 ms of the relay's, 5 ms apart", over_relay("gap_over_relay_ms"))
    row("concurrent streams: zero errors", streams_clean)
    row("concurrent streams: every one recorded", streams_recorded)
    row("RSS growth <= 64 KiB per open stream", rss)
    row("reassembly <= 10 µs per chunk (bench_reassembly)", reassembled)
    return rows


def _num(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _with_ratio(s: dict[str, Any], metric: str, digits: int) -> str:
    value = s.get(metric)
    if value is None:
        return "—"
    ratio = s.get(metric + "_x")
    return f"{_num(value, digits)} ({ratio:.2f}x)" if ratio is not None else _num(value, digits)


def markdown(results: dict[str, Any]) -> str:
    machine = results["machine"]
    summary: Summary = results.get("summary", {})
    plan = results["plan"]
    lines = [
        f"# flightrec bench — {machine['date']}",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory']}; "
        f"Linux {machine['kernel']}; Python {machine['python']}; aiohttp {machine['aiohttp']}; "
        f"orjson {machine['orjson']}; SQLite {machine['sqlite']}; "
        f"PostgreSQL {machine['postgresql']}; nginx {machine['nginx']}; "
        f"LiteLLM {machine['litellm']}.",
        "",
        f"Run: {'`--quick`' if results.get('quick') else 'full'}, {plan['rounds']} round(s) of "
        f"the closed-loop measures ({plan['seconds']:g} s each; at c=1 "
        f"{C1_WORDS.get(plan.get('c1', 'solo'), plan.get('c1'))}), {plan['maxrate_rounds']} of "
        f"the rate search, {plan['streams_rounds']} of {plan['streams']} streams x "
        f"{plan['stream_chunks']} chunks every {plan['stream_interval_ms']:g} ms; "
        f"{results.get('wall_seconds', 0):.0f} s in all. Medians across rounds; "
        "(x) = ratio to the bare relay in the same run.",
        "",
        "| target | CPU/req µs, c=8 | CPU/req µs, c=64 | CPU/req µs, 50 KB req "
        "| added p50 ms, c=1 | added p99 ms, c=1 | added TTFB p50 ms | max req/s, p99<50ms "
        "| streams ok / errors | recorded | RSS/stream KiB | CPU/chunk µs |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in summary.items():
        streams = f"{s['streams_ok']} / {s['stream_errors']}" if "streams" in s else "—"
        if s.get("stream_error_kinds"):
            streams += f" ({', '.join(s['stream_error_kinds'])})"
        recorded = str(s["recorded"]) if "recorded" in s else "n/a"
        cells = [
            name,
            _with_ratio(s, "cpu_us", 0),
            _with_ratio(s, "cpu64_us", 0),
            _with_ratio(s, "cpu_large_us", 0),
            _with_ratio(s, "added_p50_ms", 3),
            _with_ratio(s, "added_p99_ms", 3),
            _with_ratio(s, "added_ttfb_p50_ms", 3),
            _with_ratio(s, "max_rate", 0),
            streams,
            recorded,
            _with_ratio(s, "rss_per_stream_kib", 1),
            _with_ratio(s, "cpu_per_chunk_us", 1),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Absolute figures (medians): latency at c=1, time to the first body byte of a "
        f"{plan['ttfb_chunks']}-chunk stream paced at {plan['ttfb_interval_ms']:g} ms at c=1, "
        "throughput at c=8, RSS after the c=8 run; first-byte times while all the concurrent "
        "streams open (1 s ramp).",
        "",
        "| target | p50 ms | p99 ms | TTFB p50 ms | req/s, c=8 | RSS MiB | errors "
        "| streams TTFB p50 / p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in summary.items():
        errors = sum(s.get(k, 0) for k in ("latency_errors", "ttfb_errors", "cpu_errors"))
        rss = s.get("rss_kib")
        cells = [
            name,
            _num(s.get("lat_p50_ms"), 3),
            _num(s.get("lat_p99_ms"), 3),
            _num(s.get("ttfb_p50_ms"), 3),
            _num(s.get("rps_c8")),
            _num(rss / 1024 if rss else None, 1),
            str(errors),
            f"{_num(s.get('streams_ttfb_p50_ms'), 1)} / {_num(s.get('streams_ttfb_p99_ms'), 1)}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if any("b2b_ttfb_p50_ms" in s or "gap_ttfb_p50_ms" in s for s in summary.values()):
        lines += [
            "",
            f"First byte of a short stream ({plan['ttfb_chunks']} chunks at once), one client: "
            "streams sent back to back to each target alone, and "
            f"{plan.get('gap_ms', 5):g} ms apart, the targets' requests alternating. Over the "
            "relay: median over rounds of the difference to the relay's p50 in the same round.",
            "",
            "| target | back to back p50 ms | over relay ms | apart p50 ms | over relay ms |",
            "|---|---|---|---|---|",
        ]
        for name, s in summary.items():
            cells = [name] + [
                _num(s.get(key), 3)
                for key in (
                    "b2b_ttfb_p50_ms",
                    "b2b_over_relay_ms",
                    "gap_ttfb_p50_ms",
                    "gap_over_relay_ms",
                )
            ]
            lines.append("| " + " | ".join(cells) + " |")
    verdicts = checks(results)
    if verdicts and any(v for _, v in verdicts):
        shown = [n for n in RECORDING if n in summary]
        lines += ["", "## Targets, recording on (the issue's; '(ours)' marks one of our own)", ""]
        lines += ["| target | " + " | ".join(shown) + " |", "|---" * (len(shown) + 1) + "|"]
        for label, by_target in verdicts:
            lines.append(f"| {label} | " + " | ".join(by_target.get(n, "—") for n in shown) + " |")
    quiet = results.get("quiet")
    if quiet is not None:
        state = (
            "was quiet"
            if quiet.get("quiet", True)
            else "had not gone quiet (they ran anyway; their figures may read high)"
        )
        lines += [
            "",
            f"The focused benchmarks below ran once the targets were stopped: the machine {state}"
            f" after {quiet['waited_s']:g} s, {quiet['busy']:.0%} busy over the last half second.",
        ]
    lines += _reassembly(results.get("reassembly")) + _record(results.get("record"))
    skipped = {n: t["skipped"] for n, t in results.get("targets", {}).items() if t["skipped"]}
    lines += ["", "## Skipped", ""]
    lines += [f"- {n}: {why}" for n, why in skipped.items()] or ["- nothing"]
    crashed = {n: t["crashes"] for n, t in results.get("targets", {}).items() if t.get("crashes")}
    if crashed:
        lines += ["", "## Started again after exiting during the bench", ""]
        lines += [
            f"- {n}: {len(statuses)} time(s), exit statuses {statuses}; a c=8 CPU round with "
            "errors is left out of its CPU median"
            for n, statuses in crashed.items()
        ]
    lines += ["", "## Targets", ""]
    lines += [f"- {n}: {t['about']}" for n, t in results.get("targets", {}).items()]
    return "\n".join(lines) + "\n"


def _reassembly(data: dict[str, Any] | None) -> list[str]:
    if data is None:
        return []
    lines = ["", "## Reassembly (bench/bench_reassembly.py)", ""]
    if "skipped" in data:
        return [*lines, f"skipped: {data['skipped']}"]
    lines += ["| workload | flightrec µs/chunk | openai SDK µs/chunk | SDK / flightrec |"]
    lines += ["|---|---|---|---|"]
    for r in data["rows"]:
        ratio = r["openai_sdk_us"] / r["flightrec_us"]
        lines.append(
            f"| {r['workload']} | {r['flightrec_us']:.2f} | {r['openai_sdk_us']:.2f} "
            f"| {ratio:.1f}x |"
        )
    return lines


def _record(data: dict[str, Any] | None) -> list[str]:
    if data is None:
        return []
    lines = ["", "## Recording throughput (bench/bench_record.py)", ""]
    if "skipped" in data:
        return [*lines, f"skipped: {data['skipped']}"]
    lines += ["```", *data.get("lines", []), "```"]
    if "failed" in data:
        lines.append(f"failed: {data['failed']}")
    return lines


def _command(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "not available"
    text = (done.stdout + done.stderr).strip()
    return text.splitlines()[-1] if done.returncode == 0 and text else "not available"


def machine(pg: str | None) -> dict[str, Any]:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    memory = Path("/proc/meminfo").read_text().split("\n", 1)[0].split()[1]
    litellm = LITELLM_VENV / "bin" / "python"
    version = "import importlib.metadata as m; print(m.version('litellm'))"
    postgres = "not used"
    if pg:
        host, _, port = pg.partition(":")
        argv = ["psql", "-h", host, "-p", port or "5432", "-U", "postgres", "-d", "postgres"]
        postgres = _command([*argv, "-Atc", "SHOW server_version"])
    nginx = _command(["nginx", "-v"]).removeprefix("nginx version: ")
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": f"{int(memory) / 1024 / 1024:.0f} GiB",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "aiohttp": importlib.metadata.version("aiohttp"),
        "orjson": importlib.metadata.version("orjson"),
        "sqlite": sqlite3.sqlite_version,
        "postgresql": postgres,
        "nginx": nginx,
        "litellm": _command([str(litellm), "-c", version]) if litellm.exists() else "not installed",
    }
