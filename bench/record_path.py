"""The record's work per exchange, for one checkout, to be counted under callgrind:

    valgrind --tool=callgrind python -m bench.record_path DIR N [all|none|settle|rest]
    python -m bench.record_path DIR 0 prepare DB          # a database at schema head, once
    valgrind --tool=callgrind python -m bench.record_path DIR N write DB [bench|dbs|stream|logprobs]

It builds N chat exchanges (`tests.dbs.chat_exchange`) and runs what the record does with
each after the relay: settling its figures (where DIR has `proxy.sinks.settle`), the journal
line, the rows and the drivers' tuples. Count it at two N and divide the difference by the
difference of N: the interpreter's start and the imports cancel out. The garbage collector is
off, so the count does not depend on how many exchanges are held. A checkout without
`settle` prices in `rows_for`.

`write` is the whole record path as the SQLite recorder runs it at c=8: the exchanges (the
recorder bench's chat completion, `bench_record.exchange`, by default; `dbs` the tests' one;
`stream` a streamed one with its playback copy; `logprobs` the recorder bench's with 100 logprob
tokens) settled, then each batch of `BATCH` fresh
exchanges journaled (`lines.encode`), built (`rows_for`) and written by `SqliteWriter.write`
into a copy of DB (made once by `prepare`, outside the count: the migrations are not the
record path). `settled` does the same but stops after settling: count both at two N, and the
difference of the two differences is the record path alone.
"""

from __future__ import annotations

import asyncio
import gc
import gzip
import importlib
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

USAGE = {
    "prompt_tokens": 25,
    "completion_tokens": 12,
    "total_tokens": 37,
    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
    "completion_tokens_details": {
        "reasoning_tokens": 0,
        "audio_tokens": 0,
        "accepted_prediction_tokens": 0,
        "rejected_prediction_tokens": 0,
    },
}
BATCH = 100
"""Exchanges a batch: the recorder's batches at c=8 are tens to hundreds."""


def main() -> None:
    gc.disable()
    root, count = sys.argv[1], int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "all"
    sys.path.insert(0, root)
    if mode == "prepare":
        migrate = importlib.import_module("proxy.store.migrate")
        asyncio.run(migrate.upgrade(f"sqlite+aiosqlite:///{sys.argv[4]}"))
        return
    if mode in ("write", "settled"):
        shape = sys.argv[5] if len(sys.argv) > 5 else "bench"
        _write(count, mode, sys.argv[4], shape)
        return
    dbs = importlib.import_module("tests.dbs")
    lines = importlib.import_module("proxy.store.lines")
    rows = importlib.import_module("proxy.store.rows")
    try:  # a checkout from before the write batch's records had their own module
        table_records = importlib.import_module("proxy.store.records").table_records
    except ImportError:
        table_records = rows.table_records
    settle: Any = None
    try:
        settle = importlib.import_module("proxy.sinks.settle").settle
        prices = importlib.import_module("proxy.pricing").Prices()
    except ImportError:
        pass
    exchanges = []
    for _ in range(count):
        ex = dbs.chat_exchange(usage=USAGE)
        ex.response_json["usage"] = USAGE
        exchanges.append(ex)
    for ex in exchanges:
        if settle is not None and mode in ("all", "settle"):
            settle(ex, prices)
        if mode in ("all", "rest"):
            lines.encode(ex)
            for _ in table_records([rows.rows_for(ex)]):
                pass


def _exchange(shape: str) -> Any:
    if shape == "dbs":
        ex = importlib.import_module("tests.dbs").chat_exchange(usage=USAGE)
        ex.response_json["usage"] = USAGE
        return ex
    logprob_tokens = 100 if shape == "logprobs" else 0
    ex = importlib.import_module("bench.bench_record").exchange(logprob_tokens)
    if shape == "stream":
        ex.stream = True
        ex.response_body = None
        ex.content_type = "text/event-stream"
        events = b"".join(
            b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,'
            b'"delta":{"content":"word%d "},"finish_reason":null}]}\n\n' % i
            for i in range(8)
        )
        ex.raw_stream_gz = gzip.compress(events + b"data: [DONE]\n\n", 1)
        ex.raw_pacing = [(i * 120, 80.0 + i) for i in range(10)]
        ex.chunks, ex.ttft_ms, ex.response_bytes = 10, 85.0, len(events) + 14
    return ex


class _EveryTurn:
    def __init__(self, pace: object = 0.0) -> None:
        """A checkout's writer may pass its budget or its pace (`turns.pace`); every INSERT
        yields."""

    async def give(self) -> None:
        await asyncio.sleep(0)


def _write(count: int, mode: str, template: str, shape: str) -> None:
    settle = importlib.import_module("proxy.sinks.settle").settle
    prices = importlib.import_module("proxy.pricing").Prices()
    lines = importlib.import_module("proxy.store.lines")
    rows_for = importlib.import_module("proxy.store.rows").rows_for
    writer_module: Any = importlib.import_module("proxy.store.sqlite_writer")
    writer_module.Turns = _EveryTurn  # a turn after every INSERT, not after a time
    exchanges = [_exchange(shape) for _ in range(count)]
    for ex in exchanges:
        settle(ex, prices)
    if mode == "settled":
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "record.db")
        shutil.copyfile(template, path)

        async def run() -> None:
            writer = writer_module.SqliteWriter(path, busy_timeout_ms=5000)
            writer._last_checkpoint = float("inf")  # no checkpoint thread: a steady count
            try:
                for start in range(0, count, BATCH):
                    batch = exchanges[start : start + BATCH]
                    for ex in batch:
                        lines.encode(ex)
                    await writer.write([rows_for(ex) for ex in batch])
            finally:
                await writer.close()

        asyncio.run(run())


if __name__ == "__main__":
    main()
