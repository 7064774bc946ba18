"""What the SQLite recorder costs per exchange on the event loop's thread: building its rows
(`rows_for`) and writing them (`SqliteWriter.write`), CPU time, batches as the recorder takes.

    python -m bench.bench_write [--batch 200] [--batches 15] [--logprobs 100]
    PYTHONPATH=<other checkout> python bench/bench_write.py   # the same, for that checkout

The exchange is the recorder bench's chat completion (`bench_record.exchange`), plain or with
`--logprobs` tokens. The
writer's figure includes the stored-ids check, the INSERTs and what they bind, and the turns
it gives the loop; COMMIT runs on a worker thread and counts too (`time.process_time`). Run it
alternately from two checkouts to compare them (docs/performance.md, the recorder's writer).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
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


async def measure(batch: int, batches: int, logprobs: int = 0) -> tuple[float, float]:
    """(µs to build the rows, µs to write them) per exchange; the first two batches warm up."""
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "bench.db")
        await upgrade(f"sqlite+aiosqlite:///{path}")
        writer = SqliteWriter(path, busy_timeout_ms=5000)
        build = write = 0.0
        rows_for = _rows_for()
        try:
            for i in range(batches + 2):
                exchanges = [exchange(logprobs) for _ in range(batch)]
                began = time.process_time()
                rows = [rows_for(ex) for ex in exchanges]
                built = time.process_time()
                await writer.write(rows)
                if i >= 2:
                    build += built - began
                    write += time.process_time() - built
        finally:
            await writer.close()
    per = 1e6 / (batch * batches)
    return build * per, write * per


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=200, help="exchanges a batch")
    parser.add_argument("--batches", type=int, default=15, help="batches measured")
    parser.add_argument("--logprobs", type=int, default=0, help="logprob tokens an exchange")
    args = parser.parse_args()
    build, write = asyncio.run(measure(args.batch, args.batches, args.logprobs))
    print(f"rows_for {build:.2f} µs an exchange, SqliteWriter.write {write:.2f} µs")


if __name__ == "__main__":
    main()
