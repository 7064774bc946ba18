"""The whole bench in one command: flightrec against the floor (a bare aiohttp relay) and its
peers, side by side, in one process tree on this machine.

    python -m bench            # full run (about 13 minutes)
    python -m bench --quick    # about 2 minutes
    python -m bench --targets relay,flightrec-sqlite --measures cpu,latency

Targets, all in front of the same mock upstream (`bench/upstream.py`): `direct` (no proxy),
`relay` (`bench/relay.py`), `flightrec-memory` (flightrec with an in-memory recorder: the
recording-cost baseline), `flightrec-sqlite` and `flightrec-postgres` (`python -m proxy serve`),
`nginx` and `litellm` (`bench/peers.py`; skipped with the reason when they cannot be installed).

Measures run in rounds and figures are medians across rounds. At concurrency 1 (latency,
first byte) the targets' requests alternate within a round, in random order, so a slow spell
of the machine falls on all of them alike and each "added" figure is taken against the direct
figure of the same run; at concurrency 8 (CPU) every target has the machine in turn (the
starting target rotates), since CPU per request is read from each target's own process.
Every figure is also given as a ratio to the relay's in the same run. Writes `bench/results.md`
(the table) and `bench/results.json` (everything, per round).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from . import peers, procs, report
from .procs import Target

HERE = Path(__file__).resolve().parent
CHAT = "/v1/chat/completions"
TARGETS = (
    "direct",
    "relay",
    "flightrec-memory",
    "flightrec-sqlite",
    "flightrec-postgres",
    "nginx",
    "litellm",
    "base-sqlite",
    "base-postgres",
)
BASE: Path | None = None
"""`--base DIR`: another checkout (e.g. main) that the `base-*` targets run, for an A/B of a
change in one run; the `base-*` targets are added beside each `flightrec-*` target chosen."""
CONFIG: Path | None = None
"""`--config F`: the config file the `flightrec-*` targets serve with (not the `base-*` ones),
e.g. alerts and budgets evaluated against the same checkout without them."""
MEASURES = (
    "latency",
    "ttfb",
    "ttfb-b2b",
    "ttfb-gap",
    "cpu",
    "cpu-64",
    "cpu-large",
    "maxrate",
    "streams",
    "reassembly",
    "record",
)
LARGE_PROMPT = 50_000
"""Bytes of prompt added to each request of `cpu-large`: a long conversation, or a document
pasted in. What a proxy does per byte of body (recording writes every byte) shows there."""
P99_LIMIT_MS = 50.0


@dataclass(frozen=True)
class Plan:
    rounds: int = 5
    seconds: float = 2.0
    """Longest a closed-loop measure runs for one target in one round."""
    requests: int = 50_000
    """Most requests a closed-loop measure sends (the time limit usually comes first)."""
    c1: str = "paired"
    """How the c=1 measures run: "paired" (the targets' requests alternate) or "solo" (each
    target in turn, requests back to back, so a recorder's background writes fall between
    its own requests rather than in the time another target is served)."""
    ttfb_chunks: int = 8
    ttfb_interval_ms: float = 1.0
    """TTFB streams are paced, as tokens are: the first event arrives alone."""
    gap_ms: float = 5.0
    """`ttfb-gap`: a client's pause after each short stream before its next request, the
    targets' requests alternating (`ttfb-b2b` sends the next at once, to one target alone: work a
    proxy defers past a response lands on the next one)."""
    maxrate_rounds: int = 2
    step_seconds: float = 2.0
    bisections: int = 3
    streams: int = 1000
    stream_chunks: int = 100
    stream_interval_ms: float = 30.0
    streams_rounds: int = 2
    reassembly_repeat: int = 5
    record_count: int = 20_000


QUICK = Plan(
    rounds=1,
    seconds=1.0,
    maxrate_rounds=1,
    step_seconds=0.6,
    bisections=2,
    stream_interval_ms=20.0,
    streams_rounds=1,
    reassembly_repeat=3,
    record_count=3_000,
)


class LoadWorker:
    """The load generator process (`bench/load.py`), driven one JSON command at a time."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.load"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=HERE.parent,
        )

    def run(self, **cmd: Any) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(cmd) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the load generator died")
        result: dict[str, Any] = json.loads(line)
        return result

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(10)


def set_stream_shape(upstream_port: int, chunks: int, interval_ms: float) -> None:
    body = json.dumps({"chunks": chunks, "interval_ms": interval_ms}).encode()
    url = f"http://127.0.0.1:{upstream_port}/__bench/stream"
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=5):
        pass


# -- targets -------------------------------------------------------------------------------


def flightrec_target(
    name: str, about: str, upstream: str, home: Path, db_url: str, code: Path | None = None
) -> Target:
    """`flightrec serve` running the checkout `code` (default: this one, or `BASE` for a
    `base-` target), recording to `db_url`, its journal in `home`."""
    home.mkdir(parents=True, exist_ok=True)
    port = procs.free_port()
    argv = [sys.executable, "-m", "proxy", "serve", "--port", str(port)]
    argv += ["--upstream", upstream, "--db", db_url]
    if code is None:
        code = BASE if name.startswith("base-") and BASE is not None else HERE.parent
    env = {"FLIGHTREC_SPOOL_PATH": str(home / "flightrec.spool")}
    env["PYTHONPATH"] = procs.pythonpath(code)
    env["FLIGHTREC_CONSOLE_PORT"] = "0"  # the bench measures the proxy; targets run side by side
    if CONFIG is not None and not name.startswith("base-"):
        env["FLIGHTREC_CONFIG"] = str(CONFIG.resolve())
    return Target(name, about, argv, port, env, str(home), ready_path="/healthz")


def _sqlite_counter(path: Path) -> procs.RecordCounter:
    def count() -> dict[str, int]:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10) as db:
            row = db.execute(COUNT_SQL).fetchone()
        return {"total": row[0] or 0, "ok": row[1] or 0, "ok_streams": row[2] or 0}

    return count


COUNT_SQL = (
    "SELECT count(*), sum(CASE WHEN outcome = 'ok' THEN 1 ELSE 0 END),"
    " sum(CASE WHEN stream AND outcome = 'ok' THEN 1 ELSE 0 END) FROM exchanges"
)


def _psql(pg: str, database: str, sql: str) -> str:
    host, _, port = pg.partition(":")
    argv = ["psql", "-h", host, "-p", port or "5432", "-U", "postgres", "-d", database, "-Atc"]
    done = subprocess.run([*argv, sql], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr else "psql failed")
    return done.stdout.strip()


def _postgres(upstream: str, home: Path, pg: str, target_name: str) -> Target:
    name = f"flightrec_bench_{os.getpid()}_{target_name.split('-')[0]}"
    about = "flightrec serve, recording to PostgreSQL (scratch database)"
    try:
        _psql(pg, "postgres", f'DROP DATABASE IF EXISTS "{name}"')
        _psql(pg, "postgres", f'CREATE DATABASE "{name}"')
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return Target(target_name, about, skipped=f"no PostgreSQL at {pg}: {exc}")
    url = f"postgresql+asyncpg://postgres@{pg}/{name}"
    target = flightrec_target(target_name, about, upstream, home, url)

    def count() -> dict[str, int]:
        total, ok, streams = _psql(pg, name, COUNT_SQL).split("|")
        return {"total": int(total or 0), "ok": int(ok or 0), "ok_streams": int(streams or 0)}

    def drop() -> None:
        _psql(pg, "postgres", f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    target.record_counter, target.cleanup = count, drop
    return target


def build_targets(
    names: list[str], upstream_port: int, work: Path, pg: str, install: bool
) -> list[Target]:
    upstream = f"http://127.0.0.1:{upstream_port}/v1"
    targets: list[Target] = []
    for name in names:
        home = work / name
        if name == "direct":
            target = Target("direct", "no proxy: the mock upstream itself", port=upstream_port)
        elif name == "relay":
            port = procs.free_port()
            argv = [sys.executable, "-m", "bench.relay", "--port", str(port)]
            argv += ["--upstream", upstream]
            target = Target(
                "relay", "bare aiohttp relay: the floor", argv, port, cwd=str(HERE.parent)
            )
        elif name == "flightrec-memory":
            port = procs.free_port()
            counts = work / "flightrec-memory.counts.json"
            argv = [sys.executable, "-m", "bench.procs", "flightrec-memory", "--port", str(port)]
            argv += ["--upstream", upstream, "--count-file", str(counts)]
            about = "flightrec via proxy.serve.run, recorder keeps counts only (no database)"
            target = Target(name, about, argv, port, cwd=str(HERE.parent), ready_path="/healthz")
            target.record_counter = lambda path=counts: procs.read_counts(path)
        elif name in ("flightrec-sqlite", "base-sqlite"):
            db = home / "bench.db"
            about = "flightrec serve, recording to SQLite (WAL)"
            if name.startswith("base-"):
                about += f", the code in {BASE}"
            target = flightrec_target(name, about, upstream, home, f"sqlite+aiosqlite:///{db}")
            target.record_counter = _sqlite_counter(db)
        elif name in ("flightrec-postgres", "base-postgres"):
            target = _postgres(upstream, home, pg, name)
        elif name == "nginx":
            target = peers.nginx(upstream_port, work, install=install)
        else:
            target = peers.litellm(upstream_port, work, install=install)
        targets.append(target)
    return targets


# -- measures ------------------------------------------------------------------------------


def rotated(targets: list[Target], turn: int) -> list[Target]:
    """This round's order (the first target rotates), less targets whose process has died."""
    turn %= len(targets)
    return [t for t in targets[turn:] + targets[:turn] if alive(t)]


RESTARTS = 3
"""Times a target that dies during the bench is started again (LiteLLM 1.106 segfaulted
inside CPython now and then here); the crashes are reported with the results."""


def alive(target: Target) -> bool:
    """Whether the target can be measured; one that died is started again, up to RESTARTS
    times."""
    process = target.process
    if target.skipped or process is None or process.poll() is None:
        return not target.skipped
    status = process.returncode
    print(f"  {target.name} exited during the bench (status {status})", flush=True)
    if target.log_dir is not None and len(target.crashes) < RESTARTS:
        target.crashes.append(status)
        try:
            procs.start(target, target.log_dir)
            procs.wait_ready(target)
            print(f"  {target.name} started again", flush=True)
            return True
        except (OSError, RuntimeError) as exc:
            status = f"{status}; starting it again failed: {exc}"
    target.skipped = f"exited during the bench (status {status}){_tail(target.log_path)}"
    return False


SLOW = frozenset({"litellm"})
"""Targets paired with `direct` alone at c=1: at ~20 ms a request, one would take most of
every cycle it shared with the others."""
REFERENCE_KEYS = ("latency_p50_ms", "latency_p99_ms", "ttfb_p50_ms", "ttfb_p99_ms")


def paired_groups(targets: list[Target]) -> list[list[Target]]:
    """The c=1 groups: every target but the slow ones together, each slow one with `direct`."""
    direct = [t for t in targets if t.name == "direct"]
    fast = [t for t in targets if t.name not in SLOW]
    slow = [[*direct, t] for t in targets if t.name in SLOW]
    return [group for group in (fast, *slow) if group and group != direct]


def paired_round(
    worker: LoadWorker, group: list[Target], plan: Plan, shape: dict[str, Any], turn: int
) -> dict[str, dict[str, Any]]:
    """One c=1 round of `group`, requests alternated between its targets (load.py `paired`):
    each target's row, with `direct`'s figures from the same run as its `ref`."""
    result = worker.run(
        op="paired",
        ports=[t.port for t in group],
        path=CHAT,
        requests=plan.requests,
        seconds=plan.seconds * len(group),  # as long as one round of each target alone
        seed=turn,
        pids=[pid for target in group for pid in target.pids],
        **shape,
    )
    if "failed" in result:
        return {t.name: {**result, "round": turn} for t in group}
    rows = {t.name: {**r, "round": turn} for t, r in zip(group, result["results"], strict=True)}
    reference = rows.get("direct")
    if reference is not None:
        ref = {k: reference[k] for k in REFERENCE_KEYS if k in reference}
        for name, row in rows.items():
            if name != "direct":
                row["ref"] = ref
    return rows


def closed_measures(
    worker: LoadWorker, targets: list[Target], plan: Plan, measures: list[str], upstream: int
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """latency (c=1), ttfb (c=1, streams), cpu and cpu-large (c=8), cpu-64 (c=64), in interleaved
    rounds. At
    c=1 the targets' requests alternate (`paired_round`); at c=8 each target has the machine in
    turn, since CPU per request is read from the target's own process."""
    shapes: dict[str, dict[str, Any]] = {
        "latency": {"concurrency": 1, "stream": False, "warmup": 100},
        "ttfb": {"concurrency": 1, "stream": True, "warmup": 50},
        # One client sending streams back to back, each target alone; or with a pause before
        # each request, the targets' requests alternating (steadier than a target alone).
        "ttfb-b2b": {"concurrency": 1, "stream": True, "warmup": 50, "solo": True},
        "ttfb-gap": {"concurrency": 1, "stream": True, "warmup": 50, "gap_ms": plan.gap_ms},
        "cpu": {"concurrency": 8, "stream": False, "warmup": 200},
        # As `cpu`, with 64 connections: what batching and queues do under more concurrency.
        "cpu-64": {"concurrency": 64, "stream": False, "warmup": 640},
        "cpu-large": {
            "concurrency": 8,
            "stream": False,
            "warmup": 100,
            "prompt_bytes": LARGE_PROMPT,
        },
    }
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {m: {} for m in shapes if m in measures}
    for turn in range(plan.rounds):
        for measure in raw:
            if measure == "ttfb":
                set_stream_shape(upstream, plan.ttfb_chunks, plan.ttfb_interval_ms)
            elif measure.startswith("ttfb-"):  # short streams: all their chunks at once
                set_stream_shape(upstream, plan.ttfb_chunks, 0)
            solo = shapes[measure].get("solo") or plan.c1 == "solo"
            if shapes[measure]["concurrency"] == 1 and not solo:
                shape = {k: v for k, v in shapes[measure].items() if k != "concurrency"}
                running = [t for t in targets if alive(t)]
                for index, group in enumerate(paired_groups(running)):
                    for name, row in paired_round(worker, group, plan, shape, turn).items():
                        if name == "direct" and index > 0:
                            continue  # only a reference for the slow target beside it
                        raw[measure].setdefault(name, []).append(row)
                        note(f"round {turn + 1}/{plan.rounds} {measure:8} {name:19}", row)
                continue
            for target in rotated(targets, turn):
                result = worker.run(
                    op="closed",
                    port=target.port,
                    path=CHAT,
                    requests=plan.requests,
                    seconds=plan.seconds,
                    pids=target.pids,
                    **{k: v for k, v in shapes[measure].items() if k != "solo"},
                )
                result["round"] = turn
                raw[measure].setdefault(target.name, []).append(result)
                note(f"round {turn + 1}/{plan.rounds} {measure:8} {target.name:19}", result)
    return raw


def max_rate(worker: LoadWorker, target: Target, plan: Plan, guess: float) -> dict[str, Any]:
    """The highest fixed request rate with p99 under 50 ms and no errors: step up (or down)
    by 1.5x from `guess` until the verdict flips, then bisect."""
    steps: list[dict[str, Any]] = []

    def passes(rate: float) -> bool:
        result = worker.run(
            op="rate", port=target.port, path=CHAT, rate=rate, seconds=plan.step_seconds
        )
        ok = (
            "failed" not in result
            and result["errors"] == 0
            and result["ok"] == result["sent"]
            and result.get("latency_p99_ms", 1e9) < P99_LIMIT_MS
        )
        steps.append({**result, "passed": ok})
        time.sleep(0.2)
        return ok

    rate = max(guess, 10.0)
    if passes(rate):
        low, high = rate, rate * 1.5
        while high < 100_000 and passes(high):
            low, high = high, high * 1.5
    else:
        low, high = 0.0, rate
        while high > 10 and not passes(high / 1.5):
            high /= 1.5
        low = high / 1.5 if high > 10 else 0.0
    for _ in range(plan.bisections):
        middle = (low + high) / 2
        if passes(middle):
            low = middle
        else:
            high = middle
    return {"max_rate": low, "steps": steps}


def stream_measure(worker: LoadWorker, target: Target, plan: Plan, upstream: int) -> dict[str, Any]:
    set_stream_shape(upstream, plan.stream_chunks, plan.stream_interval_ms)
    before = target.record_counter() if target.record_counter else None
    # A stream not done within twice its paced length (+10 s) counts as an error: "timed out".
    timeout = plan.stream_chunks * plan.stream_interval_ms / 1000 * 2 + 10
    result = worker.run(
        op="streams",
        port=target.port,
        path=CHAT,
        count=plan.streams,
        pids=target.pids,
        ramp=1.0,
        timeout=timeout,
    )
    if before is not None and target.record_counter is not None:
        expected = before["ok_streams"] + result.get("ok", 0)
        deadline = time.monotonic() + 60
        after = target.record_counter()
        while after["ok_streams"] < expected and time.monotonic() < deadline:
            time.sleep(0.25)
            after = target.record_counter()
        result["recorded"] = after["ok_streams"] - before["ok_streams"]
    if target.pids and "rss_peak_kib" in result:
        result["rss_per_stream_kib"] = (result["rss_peak_kib"] - result["rss_before_kib"]) / (
            plan.streams
        )
        result["cpu_per_chunk_us"] = result["cpu_s"] / (plan.streams * plan.stream_chunks) * 1e6
    return result


def reassembly(plan: Plan) -> dict[str, Any]:
    """bench/bench_reassembly.py's figures (its own engineer owns it; we call its parts)."""
    try:
        from . import bench_reassembly as br
    except ImportError as exc:
        return {"skipped": f"bench/bench_reassembly.py not importable: {exc}"}
    workloads = {"generated (n=3, logprobs, tool calls)": br.generated()}
    if captures := br.captured():
        workloads[f"openai captures ({len(captures)} streams)"] = captures
    rows = []
    for name, streams in workloads.items():
        ours = br.per_chunk_us(br.flightrec, streams, plan.reassembly_repeat)
        sdk = br.per_chunk_us(br.openai_sdk, streams, plan.reassembly_repeat)
        rows.append({"workload": name, "flightrec_us": ours, "openai_sdk_us": sdk})
    return {"rows": rows, "goal_us": br.GOAL_US}


def record_throughput(plan: Plan, pg: str | None) -> dict[str, Any]:
    """bench/bench_record.py, run as its own process; its lines are reported as they are."""
    if not (HERE / "bench_record.py").exists():
        return {"skipped": "bench/bench_record.py is not there yet (hook: it runs when it is)"}
    argv = [sys.executable, "-m", "bench.bench_record", "--count", str(plan.record_count)]
    if pg:
        argv += ["--pg", f"postgresql+asyncpg://postgres@{pg}/postgres"]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=900, cwd=HERE.parent, check=False
        )
    except subprocess.TimeoutExpired:
        return {"skipped": "bench/bench_record.py did not finish within 15 minutes"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        return {"lines": lines, "failed": f"exit {done.returncode}: {tail}"}
    return {"lines": lines}


def note(label: str, result: dict[str, Any]) -> None:
    if "failed" in result:
        print(f"  {label} FAILED: {result['failed']}", flush=True)
        return
    bits = [f"ok={result.get('ok')}", f"errors={result.get('errors')}"]
    for key in ("latency_p50_ms", "ttfb_p50_ms", "rps", "cpu_s"):
        if key in result:
            bits.append(f"{key}={result[key]:.3f}")
    print(f"  {label} " + " ".join(bits), flush=True)


# -- the run -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="about 2 minutes instead of 13")
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated")
    parser.add_argument("--measures", default=",".join(MEASURES), help="comma-separated")
    parser.add_argument("--rounds", type=int, help="rounds of the closed-loop measures")
    parser.add_argument("--seconds", type=float, help="seconds per closed-loop measure")
    parser.add_argument("--streams", type=int, help="concurrent streams (default 1000)")
    parser.add_argument(
        "--c1",
        choices=("paired", "solo"),
        default="paired",
        help="c=1 measures: targets' requests alternated (default) or each target in turn",
    )
    parser.add_argument("--pg", default="127.0.0.1:5432", help="PostgreSQL host:port ('' off)")
    parser.add_argument("--no-install", action="store_true", help="do not install peers")
    parser.add_argument("--out", type=Path, default=HERE, help="where results.md/json go")
    parser.add_argument(
        "--base", type=Path, help="another checkout to A/B against (adds base-* targets)"
    )
    parser.add_argument("--config", type=Path, help="config file of the flightrec-* targets")
    return parser.parse_args(argv)


def choose(value: str, known: tuple[str, ...], what: str) -> list[str]:
    chosen = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [v for v in chosen if v not in known]
    if unknown:
        raise SystemExit(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
    return [v for v in known if v in chosen]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = QUICK if args.quick else Plan()
    overrides = {
        "rounds": args.rounds,
        "seconds": args.seconds,
        "streams": args.streams,
        "c1": args.c1,
    }
    plan = replace(plan, **{k: v for k, v in overrides.items() if v is not None})
    global BASE, CONFIG
    BASE, CONFIG = args.base, args.config
    chosen = args.targets
    if BASE is not None:
        chosen += "," + chosen.replace("flightrec-sqlite", "base-sqlite").replace(
            "flightrec-postgres", "base-postgres"
        )
    names = choose(chosen, TARGETS, "targets")
    measures = choose(args.measures, MEASURES, "measures")
    if "relay" not in names:
        names.insert(0, "relay")  # every ratio is to the relay
    if "direct" not in names:
        names.insert(0, "direct")  # every "added" figure is over direct
    if not args.pg:
        names = [n for n in names if not n.endswith("-postgres")]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="flightrec-bench-") as tmp:
        work = Path(tmp)
        results = run(plan, names, measures, work, args.pg, install=not args.no_install)
    results["quick"] = args.quick
    results["wall_seconds"] = time.time() - started
    args.out.mkdir(parents=True, exist_ok=True)
    table = report.markdown(results)
    (args.out / "results.md").write_text(table)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print("\n" + table)
    print(f"written: {args.out / 'results.md'}, {args.out / 'results.json'}")
    return 0


def run(
    plan: Plan, names: list[str], measures: list[str], work: Path, pg: str, install: bool = True
) -> dict[str, Any]:
    """Start the upstream and the targets, run the measures, stop everything; the results."""
    upstream = procs.mock_upstream()
    results: dict[str, Any] = {
        "machine": report.machine(pg),
        "plan": asdict(plan),
        "measures": measures,
    }
    running: list[Target] = []
    targets: list[Target] = []
    worker: LoadWorker | None = None
    try:
        procs.start(upstream, work)
        procs.wait_ready(upstream)
        running.append(upstream)
        targets = build_targets(names, upstream.port, work, pg, install)
        results["machine"] = report.machine(pg)  # after the peers are installed: their versions
        for target in targets:
            if target.skipped:
                print(f"skipped {target.name}: {target.skipped}", flush=True)
                continue
            try:
                procs.start(target, work)
                running.append(target)
                procs.wait_ready(target)
            except (OSError, RuntimeError) as exc:
                log_tail = _tail(target.log_path)
                target.skipped = f"could not start: {exc}{log_tail}"
                print(f"skipped {target.name}: {target.skipped}", flush=True)
        live = [t for t in targets if not t.skipped]
        worker = LoadWorker()
        closed = [m for m in measures if m != "cpu-large"]
        raw: dict[str, Any] = closed_measures(worker, live, plan, closed, upstream.port)
        if "maxrate" in measures:
            raw["maxrate"] = _maxrate_rounds(worker, live, plan, raw.get("cpu", {}))
        if "streams" in measures:
            raw["streams"] = _stream_rounds(worker, live, plan, upstream.port)
        if "cpu-large" in measures:
            # Last: 50 KB bodies grow a recorder's heap by ~100 MiB. Run before the streams,
            # that heap was reused by them and their RSS growth read near zero (1.6 KiB per
            # stream at 21:20), and the c=8 RSS read the large run's heap, not the small one's.
            raw.update(closed_measures(worker, live, plan, ["cpu-large"], upstream.port))
        for target in targets:
            alive(target)  # notes a target that died during the last measure
        results["targets"] = {
            t.name: {"about": t.about, "skipped": t.skipped, "argv": t.argv, "crashes": t.crashes}
            for t in targets
        }
        results["raw"] = raw
        # The focused benchmarks below run on this machine's CPU alone: the targets must be
        # gone first (LiteLLM went on working through the streams that timed out on it, and
        # reassembly once read 18 us a chunk beside it against 8.8 alone).
        for target in reversed(running):
            procs.stop(target)
        if "reassembly" in measures or "record" in measures:
            results["quiet"] = quiet_machine()
            print(f"  machine quiet: {results['quiet']}", flush=True)
        if "reassembly" in measures:
            print("reassembly (bench/bench_reassembly.py) ...", flush=True)
            results["reassembly"] = reassembly(plan)
        if "record" in measures:
            print("recording throughput (bench/bench_record.py) ...", flush=True)
            results["record"] = record_throughput(plan, pg or None)
        results["summary"] = report.summarize(raw, [t.name for t in live])
        return results
    finally:
        stop_all(worker, running, targets)


def stop_all(worker: LoadWorker | None, running: list[Target], targets: list[Target]) -> None:
    """Stop the load generator and the processes started (last first), then clean up after
    the targets (a PostgreSQL target's scratch database)."""
    if worker is not None:
        worker.close()
    for target in reversed(running):
        procs.stop(target)
    for target in targets:
        if target.cleanup is not None:
            target.cleanup()


def _busy_jiffies() -> tuple[int, int]:
    """(busy, total) CPU time of the whole machine so far, from /proc/stat."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    # user nice system idle iowait irq softirq steal; guest time is counted in user already.
    fields = fields[:8]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def quiet_machine(
    limit: float = 0.15, window: float = 0.5, timeout: float = 60.0
) -> dict[str, Any]:
    """Wait until the whole machine is at most `limit` busy over `window` seconds (at most
    `timeout`): what the targets left behind (PostgreSQL writing out the scratch database,
    the kernel writing back SQLite's files) shares the CPU with a microbenchmark otherwise
    (reassembly read 10.9 us a chunk straight after the targets stopped, 6.9 alone)."""
    started = time.monotonic()
    busy = 1.0
    while time.monotonic() - started < timeout:
        before = _busy_jiffies()
        time.sleep(window)
        after = _busy_jiffies()
        busy = (after[0] - before[0]) / max(1, after[1] - before[1])
        if busy <= limit:
            break
    waited = round(time.monotonic() - started, 1)
    return {"quiet": busy <= limit, "waited_s": waited, "busy": round(busy, 3)}


def _maxrate_rounds(
    worker: LoadWorker, live: list[Target], plan: Plan, cpu: dict[str, list[dict[str, Any]]]
) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for turn in range(plan.maxrate_rounds):
        for target in rotated(live, turn):
            rps = [r.get("rps", 0.0) for r in cpu.get(target.name, []) if "rps" in r]
            guess = 0.6 * statistics.median(rps) if rps else 500.0
            result = max_rate(worker, target, plan, guess)
            result["round"] = turn
            out.setdefault(target.name, []).append(result)
            label = f"maxrate {turn + 1}/{plan.maxrate_rounds} {target.name:19}"
            steps = len(result["steps"])
            print(f"  {label} {result['max_rate']:.0f} req/s ({steps} steps)", flush=True)
    return out


def _stream_rounds(
    worker: LoadWorker, live: list[Target], plan: Plan, upstream: int
) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for turn in range(plan.streams_rounds):
        for target in rotated(live, turn):
            result = stream_measure(worker, target, plan, upstream)
            result["round"] = turn
            out.setdefault(target.name, []).append(result)
            extra = f" recorded={result['recorded']}" if "recorded" in result else ""
            note(f"streams {turn + 1}/{plan.streams_rounds} {target.name:19}", result)
            if extra:
                print(f"    {extra.strip()}", flush=True)
    return out


def _tail(path: str | None, lines: int = 3) -> str:
    if not path or not Path(path).exists():
        return ""
    text = Path(path).read_text(errors="replace").strip().splitlines()[-lines:]
    return " | " + " / ".join(line.strip() for line in text)


if __name__ == "__main__":
    sys.exit(main())
