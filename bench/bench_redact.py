"""What redaction costs per exchange: the `Keep` step (`proxy/privacy/keep.py`), with and
without rules.

    python -m bench.bench_redact [--repeat 7] [--count 300]

The step runs once per exchange when its record is completed (`record.conclude`, deferred by
`Deferred`), on the event loop's thread but never before the client's first byte. Workloads are
the recorder bench's exchanges (`bench_record.exchange`): a plain chat completion (~1.5 KB of
request and answer), the same streamed in 100 events whose raw bytes were kept (~24 KB), one
with 100 logprob tokens (5 alternatives each, ~40 KB), and the plain one with an e-mail
address in its prompt (a match: the request's JSON is written again).
For each: the step with no rule (what every proxy without `[[redact]]` pays), with the four
presets, and, for scale, `rows_for` (building the exchange's database rows, which the
recorder does for every exchange anyway), all in the same run. Timing is timeit-style: the best
of several repeats over fresh copies of the exchange (the step changes what it redacts).
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Callable
from dataclasses import replace

from proxy.config import Config, ConfigError
from proxy.exchange import Exchange
from proxy.privacy.keep import Keep
from proxy.privacy.redact import PRESETS, parse_rules
from proxy.store.rows import rows_for
from proxy.stream.rawcopy import compress_whole

from .bench_record import exchange
from .upstream import stream_events


def streamed(chunks: int = 100) -> Exchange:
    """The plain exchange as a stream of `chunks` events whose raw bytes were kept (the
    bench upstream's events): with rules on, those bytes are searched too."""
    ex = exchange(0)
    raw = b"".join(event.split(b"\r\n", 1)[1][:-2] for event in stream_events(chunks, True))
    ex.stream, ex.response_body, ex.raw_stream_gz = True, None, compress_whole(raw)
    return ex


def workloads() -> dict[str, Exchange]:
    with_email = exchange(0)
    with_email.request_json["messages"][1]["content"] += " Reply to jane.doe@example.org."
    return {
        "plain": exchange(0),
        "stream": streamed(),
        "logprobs": exchange(100),
        "plain+match": with_email,
    }


def best_us(step: Callable[[Exchange], object], ex: Exchange, count: int, repeat: int) -> float:
    """Microseconds per call: the best of `repeat` runs over `count` fresh copies."""
    best = float("inf")
    for _ in range(repeat):
        copies = [copy.deepcopy(ex) for _ in range(count)]
        begin = time.perf_counter()
        for each in copies:
            step(each)
        best = min(best, (time.perf_counter() - begin) / count)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--count", type=int, default=300)
    args = parser.parse_args()
    rules = parse_rules([{"preset": name} for name in PRESETS], ConfigError)
    steps: dict[str, Callable[[Exchange], object]] = {
        "no rule": Keep(Config()),
        "4 presets": Keep(replace(Config(), redact=rules)),
        "rows_for": rows_for,
    }
    print(f"{'workload':<12} " + " ".join(f"{name:>11}" for name in steps) + "   presets/rows")
    for name, ex in workloads().items():
        us = {step: best_us(fn, ex, args.count, args.repeat) for step, fn in steps.items()}
        cells = " ".join(f"{us[step]:>8.1f} us" for step in steps)
        print(f"{name:<12} {cells}   {us['4 presets'] / us['rows_for']:>10.2f}x", flush=True)


if __name__ == "__main__":
    main()
