"""Stream reassembly cost: flightrec's SSE parser + reassembler against the openai SDK.

    python -m bench.bench_reassembly [--repeat 7]

Both sides do the whole per-chunk job, as they do in real use, on the same bytes delivered
one event per read (how token streams arrive):

- flightrec: `SSEParser.feed`, `orjson.loads` of each event's data, `ChatAssembler.add`,
  and `result()` at the end;
- the SDK (what `client.chat.completions.stream()` runs): its `SSEDecoder`, `json.loads`,
  `construct_type(ChatCompletionChunk, ...)` as `Stream` does for a default client, the
  weak validity check and `ChatCompletionStreamState.handle_chunk` as `ChatCompletionStream`
  does, consuming the events it builds, and `get_final_completion()` at the end.

Workloads: the real OpenAI captures when `../shared/captures` is beside the checkout, and a
generated stream (n=3, logprobs with top_logprobs, parallel tool calls) so the bench runs
anywhere.
Timing is timeit-style: the best of several repeats, both sides in the same run.
"""

from __future__ import annotations

import argparse
import random
import string
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import orjson
from openai._models import construct_type
from openai._streaming import SSEDecoder
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.lib.streaming.chat._completions import _is_valid_chat_completion_chunk_weak
from openai.types.chat import ChatCompletionChunk

from proxy.stream.chat import ChatAssembler
from proxy.stream.sse import SSEParser

CAPTURES = Path(__file__).resolve().parents[2] / "shared" / "captures" / "openai-python"
GOAL_US, GOAL_RATIO = 10.0, 20.0

Reads = list[bytes]


def flightrec(streams: list[Reads]) -> None:
    loads = orjson.loads
    for reads in streams:
        parser = SSEParser()
        assembler = ChatAssembler()
        for read in reads:
            for event in parser.feed(read):
                if event.data != b"[DONE]":
                    assembler.add(loads(event.data))
        parser.flush()
        assembler.result()


def openai_sdk(streams: list[Reads]) -> None:
    for reads in streams:
        state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
        for sse in SSEDecoder().iter_bytes(iter(reads)):
            if sse.data.startswith("[DONE]"):
                break
            chunk = cast(
                ChatCompletionChunk, construct_type(type_=ChatCompletionChunk, value=sse.json())
            )
            if not _is_valid_chat_completion_chunk_weak(chunk):
                continue
            for _event in state.handle_chunk(chunk):
                pass
        state.get_final_completion()


def event_reads(stream: bytes) -> Reads:
    return [block + b"\n\n" for block in stream.split(b"\n\n") if block]


def captured() -> list[Reads]:
    if not CAPTURES.is_dir():
        return []
    return [event_reads(path.read_bytes()) for path in sorted(CAPTURES.glob("*.sse"))]


def generated(tokens: int = 120, seed: int = 0) -> list[Reads]:
    """One OpenAI-shaped stream: three choices (two text answers with logprobs and five
    top_logprobs per token, one making two parallel tool calls), a token per chunk,
    interleaved, then a usage chunk."""
    rng = random.Random(seed)
    head = {
        "id": "chatcmpl-" + "".join(rng.choices(string.ascii_letters, k=29)),
        "object": "chat.completion.chunk",
        "created": 1727346178,
        "model": "gpt-4o-2024-08-06",
        "system_fingerprint": "fp_5050236cbd",
        "usage": None,
    }

    def word() -> str:
        return " " + "".join(rng.choices(string.ascii_lowercase, k=rng.randint(1, 8)))

    def logprob(token: str) -> dict[str, Any]:
        return {"token": token, "logprob": -rng.random() * 3, "bytes": list(token.encode())}

    def text_choice(index: int) -> list[dict[str, Any]]:
        first = {"role": "assistant", "content": "", "refusal": None}
        entries = [{"index": index, "delta": first, "logprobs": {"content": [], "refusal": None}}]
        for _ in range(tokens):
            token = word()
            top = [logprob(token)] + [logprob(word()) for _ in range(4)]
            lp = {"content": [{**logprob(token), "top_logprobs": top}], "refusal": None}
            entries.append({"index": index, "delta": {"content": token}, "logprobs": lp})
        entries.append({"index": index, "delta": {}, "finish_reason": "stop"})
        return entries

    def tool_choice(index: int) -> list[dict[str, Any]]:
        entries = [{"index": index, "delta": {"role": "assistant", "content": None}}]
        for call, name in enumerate(["get_weather", "get_stock_price"]):
            opening = {"name": name, "arguments": ""}
            call_id = "call_" + "".join(rng.choices(string.ascii_letters, k=24))
            tool = {"index": call, "id": call_id, "type": "function", "function": opening}
            entries.append({"index": index, "delta": {"tool_calls": [tool]}})
            for _ in range(tokens // 4):
                part = {"index": call, "function": {"arguments": word()}}
                entries.append({"index": index, "delta": {"tool_calls": [part]}})
        entries.append({"index": index, "delta": {}, "finish_reason": "tool_calls"})
        return entries

    streams = [text_choice(0), text_choice(1), tool_choice(2)]
    # Choices open in index order, as OpenAI sends them (and as the SDK's accumulator needs).
    openings = [stream.pop(0) for stream in streams]
    chunks = [
        {**head, "choices": [{"logprobs": None, "finish_reason": None, **e}]} for e in openings
    ]
    while any(streams):
        stream = rng.choice([s for s in streams if s])
        entry = {"logprobs": None, "finish_reason": None, **stream.pop(0)}
        chunks.append({**head, "choices": [entry]})
    usage = {"prompt_tokens": 80, "completion_tokens": 3 * tokens, "total_tokens": 80 + 3 * tokens}
    chunks.append({**head, "choices": [], "usage": usage})
    body = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    return [event_reads(body)]


def per_chunk_us(run: Callable[[list[Reads]], None], streams: list[Reads], repeat: int) -> float:
    chunks = sum(len(reads) for reads in streams)
    timer = timeit.Timer(lambda: run(streams))
    number, _ = timer.autorange()
    best = min(timer.repeat(repeat=repeat, number=number))
    return best / number / chunks * 1e6


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    args.add_argument("--repeat", type=int, default=7, help="repeats; the best one counts")
    repeat = args.parse_args(argv).repeat
    workloads = {"generated: n=3, logprobs, tool calls": generated()}
    if captures := captured():
        workloads = {f"openai captures ({len(captures)} streams)": captures, **workloads}
    else:
        print(f"({CAPTURES} absent: generated workload only)")
    ok = True
    print(f"{'workload':42} {'chunks':>6} {'flightrec':>12} {'openai SDK':>12} {'ratio':>7}")
    for name, streams in workloads.items():
        ours = per_chunk_us(flightrec, streams, repeat)
        sdk = per_chunk_us(openai_sdk, streams, repeat)
        chunks = sum(len(reads) for reads in streams)
        print(f"{name:42} {chunks:6} {ours:9.2f} µs {sdk:9.2f} µs {sdk / ours:6.1f}x")
        ok = ok and ours <= GOAL_US and sdk / ours >= GOAL_RATIO
    print(f"goal: flightrec <= {GOAL_US:g} µs/chunk and >= {GOAL_RATIO:g}x faster: ", end="")
    print("met" if ok else "NOT MET")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
