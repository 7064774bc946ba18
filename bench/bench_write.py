"""What the SQLite recorder costs per exchange on the event loop's thread: building its rows
(`rows_for`) and writing them (`SqliteWriter.write`), CPU time, batches as the recorder takes.

    python -m bench.bench_write [--batch 200 | --sizes 95-230] [--batches 15] [--logprobs 100]
    PYTHONPATH=<other checkout> python bench/bench_write.py   # the same, for that checkout

The exchange is the recorder bench's chat completion (`bench_record.exchange`), plain or with
`--logprobs` tokens; with `--sizes LO-HI` each batch holds a number
of them drawn between LO and HI (the same draws for every run), as a worker's batches come
under load, instead of `--batch` every time. The
writer's figure includes the stored-ids check, the INSERTs and what they bind, and the turns
it gives the loop; COMMIT runs on a worker thread and counts too (`time.process_time`). Run it
alternately from two checkouts to compare them (docs/performance.md, the recorder's writer).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.bench_record import exchange
from proxy.store import upgrade
from proxy.store.sqlite_writer import SqliteWriter


def _rows_for() -> Callable[..., Any]:
    try:
        return importlib.import_module("proxy.store.rows").rows_for  # type: ignore[no-any-return]
    except ImportError:  # a checkout from before issue 20
        return importlib.import_module("proxy.store.write").rows_for  # type: ignore[no-any-return]


async def measure(
    batch: int, batches: int, logprobs: int = 0, sizes: tuple[int, int] | None = None
) -> tuple[float, float]:
    """(µs to build the rows, µs to write them) per exchange; the first two batches warm up.
    `sizes`: each batch's size drawn between these two, instead of `batch`."""
    draw = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "bench.db")
        await upgrade(f"sqlite+aiosqlite:///{path}")
        writer = SqliteWriter(path, busy_timeout_ms=5000)
        build = write = 0.0
        written = 0
        rows_for = _rows_for()
        try:
            for i in range(batches + 2):
                size = draw.randint(*sizes) if sizes else batch
                exchanges = [exchange(logprobs) for _ in range(size)]
                began = time.process_time()
                rows = [rows_for(ex) for ex in exchanges]
                built = time.process_time()
                await writer.write(rows)
                if i >= 2:
                    written += size
                    build += built - began
                    write += time.process_time() - built
        finally:
            await writer.close()
    per = 1e6 / written
    return build * per, write * per


def _sizes(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    try:
        sizes = int(low), int(high)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not LO-HI: {text!r}") from None
    if not 1 <= sizes[0] <= sizes[1]:
        raise argparse.ArgumentTypeError(f"want 1 <= LO <= HI: {text!r}")
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=200, help="exchanges a batch")
    parser.add_argument("--batches", type=int, default=15, help="batches measured")
    parser.add_argument("--logprobs", type=int, default=0, help="logprob tokens an exchange")
    parser.add_argument("--sizes", type=_sizes, help="LO-HI: batch sizes drawn between these")
    args = parser.parse_args()
    build, write = asyncio.run(measure(args.batch, args.batches, args.logprobs, args.sizes))
    print(f"rows_for {build:.2f} µs an exchange, SqliteWriter.write {write:.2f} µs")


if __name__ == "__main__":
    main()
