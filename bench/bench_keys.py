"""What the writer's session keys (`store.threads.keys`) cost for agent-sized chat requests.

    python -m bench.bench_keys [--base DIR] [--rounds 3]

Each request is a system prompt, then turns of a user message, an assistant message with a
tool call and the tool's answer, then a user message: the shape an agent sends back, its whole
history each time. CPU µs per call (the best of `timeit` repeats), for this checkout and, with
`--base`, DIR's `proxy/store/threads.py`, the two alternating within each round; the keys of
both must be equal (docs/performance.md, *Long conversations*).
"""

from __future__ import annotations

import argparse
import timeit
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson

from bench.procs import checkout_module

HERE = Path(__file__).resolve().parent
SHAPES = ((0, 0), (1, 100), (5, 500), (20, 1000), (50, 2000))
"""(turns, bytes of each message) of the requests measured."""
ANSWER = {"choices": [{"message": {"role": "assistant", "content": "done"}}]}


def conversation(turns: int, size: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent. " * 50}]
    for i in range(turns):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        messages += [
            {"role": "user", "content": f"question {i} " * (size // 12)},
            {"role": "assistant", "content": f"answer {i} " * (size // 10), "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "content": "result " * (size // 7)},
        ]
    messages.append({"role": "user", "content": "go on"})
    return {"model": "gpt-5", "messages": messages}


def threads_of(checkout: Path, name: str) -> ModuleType:
    """`proxy/store/threads.py` of `checkout` (what it imports, `proxy.store.tables` for the
    writer's linking, which `keys` does not use, comes from this checkout)."""
    return checkout_module(checkout, "proxy/store/threads.py", name)


def per_call_us(module: ModuleType, request: dict[str, Any]) -> float:
    number = 300 if len(request["messages"]) < 50 else 50
    timer = timeit.Timer(lambda: module.keys(request, ANSWER))
    return min(timer.repeat(repeat=3, number=number)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, help="another checkout to measure alternately")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sides = {"this": threads_of(HERE.parent, "threads_this")}
    if args.base:
        sides["base"] = threads_of(args.base.resolve(), "threads_base")
    print("| messages | request bytes | " + " | ".join(f"{s} µs" for s in sides) + " | ratio |")
    print("|---" * (len(sides) + 3) + "|")
    for turns, size in SHAPES:
        request = conversation(turns, size)
        if "base" in sides and sides["this"].keys(request, ANSWER) != sides["base"].keys(
            request, ANSWER
        ):
            raise SystemExit(f"{turns} turns: the two checkouts' keys differ")
        best = dict.fromkeys(sides, float("inf"))
        for _ in range(args.rounds):
            for side, module in sides.items():
                best[side] = min(best[side], per_call_us(module, request))
        ratio = f"{best['this'] / best['base']:.2f}x" if "base" in best else "—"
        figures = " | ".join(f"{best[s]:.1f}" for s in sides)
        size_bytes = len(orjson.dumps(request))
        print(f"| {len(request['messages'])} | {size_bytes:,} | {figures} | {ratio} |")


if __name__ == "__main__":
    main()
