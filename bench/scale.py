"""Scaling: `flightrec serve --workers N` against the bare relay in N processes, N = 1, 2, ...

    python -m bench.scale [--quick] [--workers 1,2,4,8] [--loaders L] [--connections C]
        [--seconds S] [--rounds R] [--streams K] [--streams-at 1,8] [--pg URL] [--out DIR]

For each N, the relay (`bench/relay.py`, N processes sharing a port with SO_REUSEPORT) and
flightrec (`serve --workers N`, default configuration: recording to SQLite, or to a scratch
PostgreSQL database with `--pg`; metrics on) are started in turn, `--rounds` times, the order
alternating, against one mock upstream of N processes (its own port, SO_REUSEPORT). L load
processes (`bench/load.py`, default: half the cores, at least 2) each hold C keep-alive
connections sending chat completions back to back for S seconds, all at once, so the load
generator is never the limit. Per N and target: throughput (answered requests a second), CPU
per request (the target's whole process tree, workers included, over the requests it
answered), and p99 latency over every request of every loader. Ratios are flightrec's over the
relay's at the same N, in the same round.

Then at the largest N (or at each N of `--streams-at`), K streams at once (paced: 20 events
20 ms apart), split over the load processes, to each target: how many ended complete, errors
(resets, 503s), first-byte p50/p99.

Results: `scale.json` and `scale.md` in `--out` (default: `$FLIGHTREC_SCALE_OUT`, else
`bench/`). `--quick` (N = 1, 2, 4 within the cores, 3 s, 1 round, 2,000 streams) finishes in
a few minutes on any machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import procs
from .load import percentile
from .procs import Target

HERE = Path(__file__).resolve().parent
CHAT = "/v1/chat/completions"
STREAM_CHUNKS, STREAM_INTERVAL_MS = 20, 20.0
MEDIANS = ("ok", "errors", "rps", "cpu_us_per_request", "p99_ms")
"""A measure's figures taken as medians over rounds (each round's are kept whole too)."""


class Loaders:
    """L load generator processes, sent one command each at the same moment."""

    def __init__(self, count: int) -> None:
        self.processes = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.load"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=HERE.parent,
            )
            for _ in range(count)
        ]

    def run(self, commands: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for process, cmd in zip(self.processes, commands, strict=True):
            assert process.stdin is not None
            process.stdin.write(json.dumps(cmd) + "\n")
            process.stdin.flush()
        found = []
        for process in self.processes:
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line:
                raise RuntimeError("a load generator died")
            found.append(json.loads(line))
        return found

    def close(self) -> None:
        for process in self.processes:
            if process.stdin is not None:
                process.stdin.close()
            process.wait(10)


def upstream(port: int, n: int) -> Target:
    """The `n`th mock upstream process on `port`."""
    argv = [sys.executable, "-m", "bench.upstream", "--port", str(port), "--reuse-port"]
    argv += ["--chunks", str(STREAM_CHUNKS), "--interval-ms", str(STREAM_INTERVAL_MS)]
    return Target(f"upstream-{n}", "mock upstream", argv, port, cwd=str(HERE.parent))


def relay(workers: int, upstream_url: str) -> list[Target]:
    """N relay processes on one port."""
    port = procs.free_port()
    argv = [sys.executable, "-m", "bench.relay", "--port", str(port), "--reuse-port"]
    argv += ["--upstream", upstream_url]
    return [
        Target(f"relay-{n}", "bare relay", argv, port, cwd=str(HERE.parent)) for n in range(workers)
    ]


def flightrec(workers: int, upstream_url: str, home: Path, pg: str | None) -> Target:
    home.mkdir(parents=True, exist_ok=True)
    port = procs.free_port()
    db = pg or f"sqlite+aiosqlite:///{home}/scale.db"
    argv = [sys.executable, "-m", "proxy", "serve", "--port", str(port), "--workers", str(workers)]
    argv += ["--upstream", upstream_url, "--db", db]
    env = {"FLIGHTREC_SPOOL_PATH": str(home / "flightrec.spool"), "FLIGHTREC_CONSOLE_PORT": "0"}
    env["PYTHONPATH"] = procs.pythonpath(HERE.parent)
    return Target("flightrec", "flightrec serve", argv, port, env, str(home), ready_path="/healthz")


def started(targets: list[Target], log_dir: Path, processes: int) -> list[Target]:
    """`targets` started, once `processes` of them listen on the port and are settled."""
    for target in targets:
        procs.start(target, log_dir)
    for target in targets:
        procs.wait_ready(target)
    procs.wait_listening(targets[0].port, processes, targets)
    time.sleep(0.5)  # the last worker's start-up done before the CPU is read
    return targets


def pids(targets: list[Target]) -> list[int]:
    return [pid for target in targets for pid in target.pids]


def closed(
    loaders: Loaders, port: int, targets: list[Target], args: argparse.Namespace
) -> dict[str, Any]:
    """All loaders at once against `port`: throughput, CPU per request, p99."""
    cmd = {"op": "closed", "port": port, "path": CHAT, "concurrency": args.connections}
    cmd |= {"requests": 10**9, "seconds": args.seconds, "warmup": args.connections * 20}
    cmd["raw"] = True
    tree = procs.process_tree(pids(targets))
    each_before = {pid: procs.own_cpu_seconds(pid) for pid in tree}
    cpu_before = procs.cpu_seconds(pids(targets))
    found = loaders.run([cmd] * len(loaders.processes))
    time.sleep(0.3)  # background work of what was answered (the recorder's writes) is counted
    cpu = procs.cpu_seconds(pids(targets)) - cpu_before
    # each process's own share, to see the load spread: a worker left without load reads ~0,
    # as does `serve`'s supervisor
    each = sorted(procs.own_cpu_seconds(pid) - before for pid, before in each_before.items())
    ok = sum(r.get("ok", 0) for r in found)
    latencies = sorted(ns for r in found for ns in r.get("latencies_ns", []))
    elapsed = max(r.get("elapsed_s", 0.0) for r in found) or 1.0
    return {
        "ok": ok,
        "errors": sum(r.get("errors", 0) for r in found),
        "rps": ok / elapsed,
        "cpu_us_per_request": cpu / max(ok, 1) * 1e6,
        "p99_ms": percentile(latencies, 99) / 1e6 if latencies else None,
        "cpu_s_by_process": [round(seconds, 2) for seconds in each],
    }


def streams(loaders: Loaders, port: int, count: int) -> dict[str, Any]:
    share = count // len(loaders.processes)
    timeout = STREAM_CHUNKS * STREAM_INTERVAL_MS / 1000 * 2 + 30
    cmd = {"op": "streams", "port": port, "path": CHAT, "count": share, "ramp": 1.0}
    found = loaders.run([cmd | {"timeout": timeout}] * len(loaders.processes))
    kinds: dict[str, int] = {}
    for r in found:
        for kind, n in r.get("error_kinds", {}).items():
            kinds[kind] = kinds.get(kind, 0) + n
    return {
        "streams": share * len(found),
        "ok": sum(r.get("ok", 0) for r in found),
        "errors": sum(r.get("errors", 0) for r in found),
        "error_kinds": kinds,
        "ttfb_p50_ms": max(r.get("ttfb_p50_ms", 0.0) for r in found),
        "ttfb_p99_ms": max(r.get("ttfb_p99_ms", 0.0) for r in found),
    }


@contextlib.contextmanager
def upstreams(workers: int, work: Path) -> Iterator[str]:
    """N mock upstream processes sharing a port, while the block runs; their base URL."""
    port = procs.free_port()
    up = started([upstream(port, n) for n in range(workers)], work, workers)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        for target in up:
            procs.stop(target)


@contextlib.contextmanager
def running(
    name: str, workers: int, url: str, home: Path, pg: str | None
) -> Iterator[list[Target]]:
    """The relay or flightrec at N = `workers`, while the block runs: its processes (the
    relay's N, or serve, whose workers are its children)."""
    targets = relay(workers, url) if name == "relay" else [flightrec(workers, url, home, pg)]
    try:
        yield started(targets, home.parent, workers)
    finally:
        for target in targets:
            procs.stop(target)


def measure_n(
    workers: int, loaders: Loaders, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    """Both targets at N = `workers`, `args.rounds` times, the order alternating."""
    seen: dict[str, list[dict[str, Any]]] = {"relay": [], "flightrec": []}
    with upstreams(workers, work) as url:
        for turn in range(args.rounds):
            order = ["relay", "flightrec"] if turn % 2 == 0 else ["flightrec", "relay"]
            for name in order:
                home = work / f"home-{workers}-{turn}"
                with running(name, workers, url, home, args.pg) as targets:
                    seen[name].append(closed(loaders, targets[0].port, targets, args))
                print(f"N={workers} round {turn + 1} {name}: {seen[name][-1]}", flush=True)
    medians = {
        name: {key: _median([r[key] for r in found]) for key in found[0] if key in MEDIANS}
        for name, found in seen.items()
    }
    ratios = [
        f["cpu_us_per_request"] / r["cpu_us_per_request"]
        for f, r in zip(seen["flightrec"], seen["relay"], strict=True)
    ]
    return {"workers": workers, **medians, "cpu_ratio": _median(ratios), "rounds": seen}


def _median(values: list[Any]) -> Any:
    numbers = [v for v in values if isinstance(v, int | float)]
    return statistics.median(numbers) if numbers else None


def measure_streams(
    workers: int, loaders: Loaders, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    found: dict[str, Any] = {"workers": workers}
    with upstreams(workers, work) as url:
        for name in ("relay", "flightrec"):
            with running(name, workers, url, work / "home-streams", args.pg) as targets:
                found[name] = streams(loaders, targets[0].port, args.streams)
            print(f"streams N={workers} {name}: {found[name]}", flush=True)
    return found


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"# bench.scale, {result['when']}",
        "",
        f"{result['machine']}; {result['loaders']} load processes x {result['connections']} "
        f"connections, {result['seconds']} s a measure, {result['rounds']} round(s), "
        f"recording to {result['database']}.",
        "",
        "| N | relay req/s | flightrec req/s | throughput ratio | relay CPU/req µs "
        "| flightrec CPU/req µs | CPU ratio | relay p99 ms | flightrec p99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["scaling"]:
        r, f = row["relay"], row["flightrec"]
        lines.append(
            f"| {row['workers']} | {r['rps']:,.0f} | {f['rps']:,.0f} | {f['rps'] / r['rps']:.2f}x "
            f"| {r['cpu_us_per_request']:.0f} | {f['cpu_us_per_request']:.0f} "
            f"| {row['cpu_ratio']:.2f}x | {r['p99_ms']:.2f} | {f['p99_ms']:.2f} |"
        )
    for s in result.get("streams", []):
        lines += [
            "",
            f"{s['relay']['streams']:,} streams at once, N = {s['workers']}"
            + _short_of_files(s["relay"]["streams"], s["workers"], result.get("open_files")),
            "",
            "| target | complete | errors | first byte p50 / p99 ms (worst loader) |",
            "|---|---|---|---|",
        ]
        for name in ("relay", "flightrec"):
            x = s[name]
            kinds = ", ".join(f"{k}: {n}" for k, n in x["error_kinds"].items())
            lines.append(
                f"| {name} | {x['ok']:,} | {x['errors']:,} {kinds} "
                f"| {x['ttfb_p50_ms']:.1f} / {x['ttfb_p99_ms']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def _short_of_files(streams: int, workers: int, limit: int | None) -> str:
    """A warning when a process of N takes more streams than it may hold files for: two a
    stream (the client's connection and the upstream's), the relay having no limit of its
    own (flightrec turns away what is past `max_streams`)."""
    if limit is None or 2 * streams / workers < limit:
        return ":"
    return (
        f" (at most {limit:,} open files a process, two a stream: the relay, and at N = 1 the"
        " mock upstream, may run out):"
    )


def save(result: dict[str, Any], out: Path, began: float) -> None:
    """Write what is measured so far: a run cut short still leaves its finished steps."""
    result["took_s"] = time.monotonic() - began
    (out / "scale.json").write_text(json.dumps(result, indent=1, default=str))
    (out / "scale.md").write_text(markdown(result))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    cores = os.cpu_count() or 2
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few minutes, on any machine")
    parser.add_argument(
        "--workers", help="comma-separated N (default: 1, 2, 4, ... up to a quarter of the cores)"
    )
    parser.add_argument("--loaders", type=int, default=max(2, cores // 2))
    parser.add_argument("--connections", type=int, default=32, help="per load process")
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--streams", type=int)
    parser.add_argument(
        "--streams-at", help="comma-separated N for the streams (default: the largest)"
    )
    parser.add_argument("--pg", help="record to this PostgreSQL database instead of SQLite")
    parser.add_argument("--out", type=Path, default=os.environ.get("FLIGHTREC_SCALE_OUT"))
    args = parser.parse_args(argv)
    most = max(1, cores // 4)
    ladder = [n for n in (1, 2, 4, 8, 16, 32) if n <= most] or [1]
    if args.workers:
        ladder = [int(n) for n in args.workers.split(",")]
    args.ladder = ladder[:3] if args.quick and not args.workers else ladder
    args.seconds = args.seconds or (3.0 if args.quick else 10.0)
    args.rounds = args.rounds or (1 if args.quick else 2)
    args.streams_at = (
        [int(n) for n in args.streams_at.split(",")] if args.streams_at else args.ladder[-1:]
    )
    args.streams = args.streams if args.streams is not None else (2_000 if args.quick else 20_000)
    args.out = Path(args.out or HERE)
    return args


def open_files() -> int | None:
    """Raise this process's limit of open files to the most allowed (its children, the
    targets, inherit it); returns that limit, None for no limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:  # Linux refuses an unlimited soft limit for files
        return None
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    files = open_files()
    loaders = Loaders(args.loaders)
    began = time.monotonic()
    result: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {sys.platform}, Python {sys.version.split()[0]}",
        "loaders": args.loaders,
        "connections": args.connections,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "database": "PostgreSQL" if args.pg else "SQLite",
        "open_files": files,
        "scaling": [],
    }
    try:
        with tempfile.TemporaryDirectory(prefix="flightrec-scale-") as tmp:
            for workers in args.ladder:
                result["scaling"].append(measure_n(workers, loaders, args, Path(tmp)))
                save(result, args.out, began)
            for workers in args.streams_at if args.streams else []:
                result.setdefault("streams", []).append(
                    measure_streams(workers, loaders, args, Path(tmp))
                )
                save(result, args.out, began)
    finally:
        loaders.close()
    save(result, args.out, began)
    print(markdown(result))
    print(f"written: {args.out / 'scale.json'}, {args.out / 'scale.md'} ({result['took_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
