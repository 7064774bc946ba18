"""The record's work per exchange, for one checkout, to be counted under callgrind:

    valgrind --tool=callgrind python -m bench.record_path DIR N [all|none|settle|rest]

It builds N chat exchanges (`tests.dbs.chat_exchange`) and runs what the record does with
each after the relay: settling its figures (where DIR has `proxy.sinks.settle`), the journal
line, the rows and the drivers' tuples. Count it at two N and divide the difference by the
difference of N: the interpreter's start and the imports cancel out. The garbage collector is
off, so the count does not depend on how many exchanges are held. A checkout without
`settle` prices in `rows_for`.
"""

from __future__ import annotations

import gc
import importlib
import sys
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


def main() -> None:
    gc.disable()
    root, count = sys.argv[1], int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "all"
    sys.path.insert(0, root)
    dbs = importlib.import_module("tests.dbs")
    lines = importlib.import_module("proxy.store.lines")
    rows = importlib.import_module("proxy.store.rows")
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
            for table, found in rows.table_rows([rows.rows_for(ex)]):
                rows.records(table, found)


if __name__ == "__main__":
    main()
