"""Whether recording keeps up with a busy worker: requests served against exchanges written,
while they are served.

    python -m bench.keepup [--engine sqlite|postgresql] [--concurrency 64] [--seconds 21]
        [--every 5] [--rounds 2] [--workers N] [--logprobs TOKENS] [--base DIR]
        [--pg host:port] [--json FILE]

`python -m bench` reads a target's CPU once the target is quiet, its writer's catch-up
included, and `bench.bench_record` times the recorder alone: neither shows a writer that a busy
relay leaves behind, whose journal then grows until it is full (docs/performance.md). This
bench keeps one `flightrec serve` busy with the bench's `cpu` request (`bench.load`'s closed
loop, `--concurrency` connections) for `--seconds`, and counts the exchanges in its database
every `--every` seconds meanwhile. It reports the requests served a second; the exchanges
written a second over each interval, the first left out (the writer's first batches wait for
the warm-up's); the records not written yet when the load stops and the journal's bytes on
disk then; and the seconds the writer takes to write the rest once the load has stopped.

`--logprobs 100` asks for 100 tokens with their logprobs (5 alternatives each) in every
response, as `bench_record`'s logprob workload stores. `--workers N` serves with N worker
processes (`serve --workers`), each with its own writer. With `--base DIR` each round also
runs DIR's checkout (`base-*`), the two alternating: an A/B in one run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from . import __main__ as whole
from . import procs
from .procs import Target

WARMUP = 640
"""Requests sent before the measured load (as `python -m bench`'s `cpu-64`)."""
SIBLINGS = (".done", ".bad", ".lock")
"""A journal's files that hold no records waiting (`store.journal`)."""
CATCH_UP_LIMIT = 300.0
"""Seconds the writer is given to write the rest after the load (`--catch-up-limit`)."""


def journal_bytes(target: Target) -> int:
    """Bytes of the target's journals on disk (one a worker): live segments and sealed ones."""
    if target.cwd is None:
        return 0
    files = Path(target.cwd).glob("flightrec.spool*")
    return sum(f.stat().st_size for f in files if f.suffix not in SIBLINGS and f.is_file())


def written(target: Target) -> int:
    """Exchanges in the target's database."""
    assert target.record_counter is not None
    return target.record_counter()["total"]


Samples = list[tuple[float, int]]
"""(seconds since the load began, exchanges written then)."""


def sample(target: Target, every: float, stop: threading.Event, out: Samples) -> None:
    """Append (seconds since start, exchanges written) every `every` seconds until `stop`."""
    began = time.perf_counter()
    while not stop.wait(every):
        out.append((time.perf_counter() - began, written(target)))


STILL = 10.0
"""Seconds without a record written after which a writer short of the count has stopped: the
requests that failed without reaching the upstream (a reset, a refused connection) leave no
exchange, so the count is not always reached."""


def caught_up(target: Target, expected: int, limit: float) -> None:
    """Wait until the target's database holds `expected` exchanges, for at most `limit`
    seconds, or until its count has not moved for `STILL` seconds."""
    began = moved = time.perf_counter()
    last = written(target)
    while last < expected and (now := time.perf_counter()) - began < limit:
        if now - moved > STILL:
            return
        time.sleep(0.1)
        count = written(target)
        if count != last:
            last, moved = count, time.perf_counter()


def measure(worker: whole.LoadWorker, target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """One busy spell of `args.seconds` on `target`, and its writer's catch-up after."""
    every, limit = args.every, args.catch_up_limit
    before = written(target)
    samples: Samples = [(0.0, before)]
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(target, every, stop, samples), daemon=True)
    sampler.start()
    load = worker.run(
        op="closed",
        port=target.port,
        path=whole.CHAT,
        concurrency=args.concurrency,
        logprobs=args.logprobs,
        warmup=WARMUP,
        requests=10**9,
        seconds=args.seconds,
    )
    stop.set()
    sampler.join()
    at_end, journal = written(target), journal_bytes(target)
    sent = WARMUP + load["ok"] + load["errors"]
    ended = time.perf_counter()
    caught_up(target, before + sent, limit)
    rates = [
        (count - last) / (at - then) for (then, last), (at, count) in itertools.pairwise(samples)
    ]
    return {
        "served_per_s": load["rps"],
        "written_per_s": rates[1:],
        "not_written_at_end": before + sent - at_end,
        "journal_mib_at_end": journal / 2**20,
        "catch_up_s": time.perf_counter() - ended,
        "all_written": written(target) >= before + sent,
        "p99_ms": load.get("latency_p99_ms"),
        "errors": load["errors"],
    }


def line(name: str, found: dict[str, Any]) -> str:
    rates = found["written_per_s"]
    window = f"{min(rates):,.0f}-{max(rates):,.0f}/s" if rates else "(no full window)"
    return (
        f"{name:20} served {found['served_per_s']:8,.0f}/s  written {window:>15}  "
        f"behind at the end {found['not_written_at_end']:7,}  "
        f"journal {found['journal_mib_at_end']:6.1f} MiB  "
        f"caught up in {found['catch_up_s']:5.1f} s  p99 {found['p99_ms'] or 0:6.1f} ms"
        + ("" if found["all_written"] else "  NOT ALL WRITTEN")
    )


def summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over rounds: served, written (each round's median window), behind at the end."""
    return {
        "served_per_s": statistics.median(r["served_per_s"] for r in runs),
        "written_per_s": statistics.median(
            statistics.median(r["written_per_s"]) if r["written_per_s"] else 0.0 for r in runs
        ),
        "not_written_at_end": statistics.median(r["not_written_at_end"] for r in runs),
        "catch_up_s": statistics.median(r["catch_up_s"] for r in runs),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.keepup", description=__doc__)
    parser.add_argument("--engine", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=21.0)
    parser.add_argument("--every", type=float, default=5.0, help="seconds between counts")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1, help="serve --workers N")
    parser.add_argument(
        "--logprobs", type=int, default=0, help="tokens with logprobs a response (0: none)"
    )
    parser.add_argument("--base", type=Path, help="another checkout to A/B against")
    parser.add_argument("--pg", default="127.0.0.1:5432", help="PostgreSQL host:port")
    parser.add_argument("--catch-up-limit", type=float, default=CATCH_UP_LIMIT)
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    whole.BASE = args.base.resolve() if args.base else None
    engine = "flightrec-sqlite" if args.engine == "sqlite" else "flightrec-postgres"
    names = [engine] + ([engine.replace("flightrec-", "base-")] if args.base else [])
    upstream = procs.mock_upstream()
    work = Path(tempfile.mkdtemp(prefix="flightrec-keepup-"))
    targets: list[Target] = []
    running: list[Target] = [upstream]
    worker: whole.LoadWorker | None = None
    found: dict[str, list[dict[str, Any]]] = {}
    try:
        procs.start(upstream, work)
        procs.wait_ready(upstream)
        targets = whole.build_targets(names, upstream.port, work, args.pg, install=False)
        for target in targets:
            if args.workers > 1:
                target.argv += ["--workers", str(args.workers)]
            if target.skipped:
                print(f"{target.name}: {target.skipped}", file=sys.stderr)
                return 2
            procs.start(target, work)
            running.append(target)
            procs.wait_ready(target)
            procs.wait_listening(target.port, args.workers, [target])
        worker = whole.LoadWorker()
        for turn in range(args.rounds):
            for target in whole.rotated(targets, turn):
                result = measure(worker, target, args)
                found.setdefault(target.name, []).append(result)
                print(f"round {turn + 1}/{args.rounds} " + line(target.name, result), flush=True)
    finally:
        whole.stop_all(worker, running, targets)
        shutil.rmtree(work, ignore_errors=True)
    medians = {name: summary(runs) for name, runs in found.items()}
    for name, med in medians.items():
        print(
            f"median {name:20} served {med['served_per_s']:8,.0f}/s  "
            f"written {med['written_per_s']:8,.0f}/s  "
            f"behind at the end {med['not_written_at_end']:8,.0f}  "
            f"caught up in {med['catch_up_s']:5.1f} s"
        )
    if args.json is not None:
        args.json.write_text(json.dumps({"rounds": found, "medians": medians}, indent=1))
    return 0 if all(r["all_written"] for runs in found.values() for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
