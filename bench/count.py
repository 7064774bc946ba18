"""Instructions a request, counted rather than timed: flightrec serve under valgrind.

    python -m bench.count [--requests 1500] [--stream] [--base DIR] [--relay] [--memory]
        [--keep DIR]

On a shared 2-core machine the bench's CPU figures move by 20-40 % from one round to the next,
so an A/B of a few per cent needs many rounds and still reads noise. Instructions do not move
with the machine. This starts the mock upstream and `flightrec serve` (SQLite, in a scratch
directory) under `valgrind --tool=callgrind` with counting off, sends `WARMUP` requests,
counts the proxy process's instructions (every thread; no kernel time) over `--requests` more
from one client, and prints them per request, for this checkout and, with `--base`, for
another one, counted the same way one after the other; with `--relay` the bare relay
(`bench/relay.py`) too, the floor the issue's ratios are taken to.

With SQLite the count moves by up to ~10 % between runs of the same code (how many records
the writer's batches hold depends on timing, and valgrind slows the proxy ~50x). `--memory`
counts flightrec with the bench's counting recorder instead (`bench.procs flightrec-memory`:
everything but the database), steady to ~1 %: the request path's A/B. `--keep DIR` keeps
each callgrind output there (`callgrind_annotate --inclusive=no DIR/this.out`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import procs
from .__main__ import CHAT, flightrec_target, set_stream_shape
from .load import Connection, request_bytes

HERE = Path(__file__).resolve().parent.parent
WARMUP = 200
SETTLE = 3.0
"""Seconds after the last request before counting starts or stops: the record's deferred work
and the writer's batch run under valgrind too."""
_TOTALS = re.compile(rb"^totals: (\d+)", re.MULTILINE)


def totals(callgrind_out: bytes) -> int:
    """The instruction total of a callgrind output file: its `totals:` line, written at the end
    (the `summary:` line near the top is written before anything was counted)."""
    found = _TOTALS.findall(callgrind_out)
    if not found:
        raise ValueError("no totals line in the callgrind output")
    return int(found[-1])


async def _send(port: int, requests: int, stream: bool) -> None:
    connection = await Connection.open(port)
    raw = request_bytes(port, CHAT, stream)
    try:
        for _ in range(requests):
            reply = await connection.send(raw, time.perf_counter_ns(), stream)
            if reply.status != 200:
                raise RuntimeError(f"the proxy answered {reply.status}")
    finally:
        connection.close()


def _callgrind_control(flag: str, pid: int) -> None:
    subprocess.run(["callgrind_control", "-i", flag, str(pid)], check=True, capture_output=True)


def count(
    code: Path | None, requests: int, stream: bool, work: Path, memory: bool = False
) -> float:
    """Instructions a request of `flightrec serve` running the checkout `code` (None: the
    bare relay; `memory`: flightrec with the counting recorder, no database)."""
    upstream = procs.mock_upstream()
    out = work / "callgrind.out"
    base_url = f"http://127.0.0.1:{upstream.port}/v1"
    work.mkdir(parents=True, exist_ok=True)
    port = procs.free_port()
    if code is None:
        argv = [sys.executable, "-m", "bench.relay", "--port", str(port), "--upstream", base_url]
        proxy = procs.Target("relay-callgrind", "the bare relay", argv, port, cwd=str(HERE))
    elif memory:
        argv = [sys.executable, "-m", "bench.procs", "flightrec-memory", "--port", str(port)]
        argv += ["--upstream", base_url, "--count-file", str(work / "counts.json")]
        # The checkout's own code, its bench's launcher included (not this directory's).
        env = {"PYTHONPATH": procs.pythonpath(code)}
        about = f"flightrec without a database, the code in {code}"
        proxy = procs.Target("memory-callgrind", about, argv, port, env, str(work))
        proxy.ready_path = "/healthz"
    else:
        proxy = flightrec_target(
            "flightrec-callgrind",
            f"flightrec serve under callgrind, the code in {code}",
            base_url,
            work,
            f"sqlite+aiosqlite:///{work}/bench.db",
            code,
        )
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
    proxy.argv = [*valgrind, f"--callgrind-out-file={out}", *proxy.argv]
    proxy.ready_timeout = 600.0
    started: list[procs.Target] = []
    try:
        for target in (upstream, proxy):
            procs.start(target, work)
            started.append(target)
            procs.wait_ready(target)
        set_stream_shape(upstream.port, 8, 0)
        assert proxy.process is not None
        asyncio.run(_send(proxy.port, WARMUP, stream))
        time.sleep(SETTLE)  # the warm-up's deferred work is not counted
        _callgrind_control("on", proxy.process.pid)
        asyncio.run(_send(proxy.port, requests, stream))
        time.sleep(SETTLE)
        _callgrind_control("off", proxy.process.pid)
    finally:
        for target in reversed(started):
            procs.stop(target, grace=300.0)
    return totals(out.read_bytes()) / requests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1500, help="requests counted")
    parser.add_argument("--stream", action="store_true", help="short streams, not plain")
    parser.add_argument("--base", type=Path, help="another checkout, counted the same way")
    parser.add_argument("--relay", action="store_true", help="count the bare relay too")
    parser.add_argument(
        "--memory", action="store_true", help="flightrec with the counting recorder, no database"
    )
    parser.add_argument("--keep", type=Path, help="keep the callgrind outputs in this folder")
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    checkouts: dict[str, Path | None] = {"this": HERE}
    if args.base:
        checkouts["base"] = args.base.resolve()
    if args.relay:
        checkouts["relay"] = None
    counted: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="flightrec-count-") as scratch:
        for name, code in checkouts.items():
            work = Path(scratch) / name
            counted[name] = count(code, args.requests, args.stream, work, args.memory)
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(Path(scratch) / name / "callgrind.out", args.keep / f"{name}.out")
            where = code or "bench/relay.py"
            print(f"{name:5} {where}: {counted[name]:,.0f} instructions a request", flush=True)
    if "base" in counted:
        print(f"this/base: {counted['this'] / counted['base']:.3f}")
    if "relay" in counted:
        for name in ("this", "base"):
            if name in counted:
                print(f"{name}/relay: {counted[name] / counted['relay']:.3f}")
    print(json.dumps(counted))
    return 0


if __name__ == "__main__":
    sys.exit(main())
