"""The first byte of a short stream through several processes of each checkout.

    python -m bench.first_byte [--processes 3] [--base DIR] [--gap-ms 5] [--alone]

The bench's `ttfb-gap` runs one process of each target, and the same code in two processes
reads up to ~0.03 ms apart (docs/performance.md, *The process, not the slot*): too much for a
difference of a few hundredths of a millisecond. This starts the mock upstream, the bare relay
and `--processes` of `flightrec serve` from this checkout (and as many from `--base`), then
sends one client's short streams (8 chunks and the usage event at once) to all of them in a
shuffled order, `--gap-ms` after each, for `--rounds` rounds; with `--alone`, to each process
alone in turn, `--gap-ms` after each (0: back to back, as the bench's `ttfb-b2b`; noisier,
the relay being measured once a round, seconds from some of the processes). Alternated, a
process waits for the others too, so its pause grows with their number: compare checkouts in
one run. It prints each round's first-byte p50s, then each process's p50 over the relay's (the
median over rounds of the difference in a round) and each checkout's mean. A target with
failed requests stops the run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from . import load, procs
from .__main__ import flightrec_target, set_stream_shape


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--processes", type=int, default=3, help="of each checkout")
    parser.add_argument("--base", type=Path, help="another checkout, measured beside this one")
    parser.add_argument("--gap-ms", type=float, default=5.0, help="pause after each stream")
    parser.add_argument(
        "--alone",
        action="store_true",
        help="each process alone in turn (--gap-ms 0: back to back, the bench's ttfb-b2b)",
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=8.0, help="per round")
    parser.add_argument("--chunks", type=int, default=8, help="of each stream, sent at once")
    return parser.parse_args(argv)


def targets(args: argparse.Namespace, upstream: str, work: Path) -> list[procs.Target]:
    port = procs.free_port()
    argv = [sys.executable, "-m", "bench.relay", "--port", str(port), "--upstream", upstream]
    found = [procs.Target("relay", "bare aiohttp relay", argv, port, cwd=str(procs.ROOT))]
    checkouts = [("this", procs.ROOT)] + ([("base", args.base.resolve())] if args.base else [])
    for label, code in checkouts:
        for i in range(args.processes):
            name = f"{label}-{i}"
            db = f"sqlite+aiosqlite:///{work / name}.db"
            found.append(flightrec_target(name, str(code), upstream, work / name, db, code))
    return found


def one_round(found: list[procs.Target], args: argparse.Namespace, turn: int) -> dict[str, float]:
    """Each target's first-byte p50 (ms) in one round; the order rotates with `turn`."""
    order = found[turn % len(found) :] + found[: turn % len(found)]
    if args.alone:
        return {target.name: _alone(target, args) for target in order}
    command: dict[str, Any] = {
        "ports": [target.port for target in order],
        "path": "/v1/chat/completions",
        "stream": True,
        "seed": turn,
        "gap_ms": args.gap_ms,
        "warmup": 50,
        "requests": 10**9,
        "seconds": args.seconds,
        "pids": [pid for target in found for pid in target.pids],
    }
    results = asyncio.run(load.paired_loop(command))["results"]
    return {target.name: _p50(target, r) for target, r in zip(order, results, strict=True)}


def _alone(target: procs.Target, args: argparse.Namespace) -> float:
    command: dict[str, Any] = {
        "port": target.port,
        "path": "/v1/chat/completions",
        "stream": True,
        "concurrency": 1,
        "gap_ms": args.gap_ms,
        "warmup": 50,
        "requests": 10**9,
        "seconds": args.seconds,
        "pids": target.pids,
    }
    return _p50(target, asyncio.run(load.closed_loop(command)))


def _p50(target: procs.Target, result: dict[str, Any]) -> float:
    """The first-byte p50 of a target's result; a measure with failed requests is none."""
    if result.get("errors") or "ttfb_p50_ms" not in result:
        raise SystemExit(f"{target.name}: requests failed: {result.get('error_kinds')}")
    return float(result["ttfb_p50_ms"])


def report(rows: list[dict[str, float]], names: list[str]) -> list[str]:
    """Per process: the median over rounds of its p50 minus the relay's; per checkout: the
    mean of its processes' medians."""
    over = {name: statistics.median(row[name] - row["relay"] for row in rows) for name in names}
    lines = [f"{name}: {over[name]:+.3f} ms over the relay" for name in names]
    for label in sorted({name.rsplit("-", 1)[0] for name in names}):
        mine = [over[name] for name in names if name.rsplit("-", 1)[0] == label]
        lines.append(f"{label} (mean of {len(mine)}): {statistics.fmean(mine):+.3f} ms")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="flightrec-first-byte-"))
    upstream = procs.mock_upstream()
    found: list[procs.Target] = []
    try:
        procs.start(upstream, work)
        procs.wait_ready(upstream)
        found = targets(args, f"http://127.0.0.1:{upstream.port}/v1", work)
        for target in found:
            procs.start(target, work)
        for target in found:
            procs.wait_ready(target)
        set_stream_shape(upstream.port, args.chunks, 0)
        rows = []
        for turn in range(args.rounds):
            row = one_round(found, args, turn)
            rows.append(row)
            print(f"round {turn + 1}: " + "  ".join(f"{t.name} {row[t.name]:.3f}" for t in found))
        print("\n".join(report(rows, [t.name for t in found[1:]])))
    finally:
        for target in [*found, upstream]:
            procs.stop(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
