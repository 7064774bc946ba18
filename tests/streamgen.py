"""Turn a non-streaming `chat.completion` into the stream an OpenAI-like upstream would send.

Used by the reassembly tests (stream it, reassemble it, compare with the original), by the
end-to-end tests' fake upstream, and by the benchmark:

    chunks = completion_to_chunks(completion, include_usage=True, rng=random.Random(0))
    body = chunks_to_sse(chunks)        # b"data: {...}\\n\\n ... data: [DONE]\\n\\n"

The split is random but faithful: every string (content, refusal, tool-call arguments) is cut
at random points, logprobs lists are cut independently of the text they belong to, tool
calls and choices are interleaved randomly (each keeping its own order), and the first chunk
of a choice carries the role, as OpenAI does. Reassembling the chunks gives back the
original completion exactly, less `usage` when `include_usage` is False.

`completions()` is a hypothesis strategy for such originals.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable
from typing import Any

import orjson
from hypothesis import strategies as st

Json = dict[str, Any]


def _cut(text: str, rng: random.Random, *, max_parts: int = 6) -> list[str]:
    """`text` in 1..max_parts pieces, some possibly empty; they join back to `text`."""
    cuts = sorted(rng.randint(0, len(text)) for _ in range(rng.randint(0, max_parts - 1)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def _cut_list(items: list[Any], rng: random.Random) -> list[list[Any]]:
    cuts = sorted(rng.randint(0, len(items)) for _ in range(rng.randint(0, 3)))
    bounds = [0, *cuts, len(items)]
    return [items[a:b] for a, b in itertools.pairwise(bounds)]


def _interleave(streams: Iterable[list[Any]], rng: random.Random) -> list[Any]:
    """Merge lists in a random order that keeps each list's own order."""
    pending = [list(reversed(s)) for s in streams if s]
    out: list[Any] = []
    while pending:
        stream = rng.choice(pending)
        out.append(stream.pop())
        if not stream:
            pending.remove(stream)
    return out


def _delta_fragments(message: Json, rng: random.Random) -> list[tuple[str, Any]]:
    """The message as a sequence of (key, piece) fragments, streams interleaved."""
    streams: list[list[tuple[str, Any]]] = []
    for key in ("content", "refusal"):
        if message.get(key) is not None:
            streams.append([(key, piece) for piece in _cut(message[key], rng)])
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        pieces = _cut(function["arguments"], rng)
        first = {
            "index": index,
            "id": call["id"],
            "type": call["type"],
            "function": {"name": function["name"], "arguments": pieces[0]},
        }
        rest = [{"index": index, "function": {"arguments": piece}} for piece in pieces[1:]]
        streams.append([("tool_calls", first), *[("tool_calls", r) for r in rest]])
    return _interleave(streams, rng)


def _choice_chunks(choice: Json, rng: random.Random) -> list[Json]:
    """The chunk-level `choices` entries that stream one choice."""
    message = choice["message"]
    first: Json = {"role": message.get("role", "assistant")}
    # OpenAI's first delta names the fields that will stay null (a key the message lacks
    # is one the stream never carried).
    for key in ("content", "refusal"):
        if key in message and message[key] is None:
            first[key] = None
    deltas: list[Json] = [first]
    for key, piece in _delta_fragments(message, rng):
        delta = deltas[-1]
        mergeable = key == "tool_calls" or key not in delta
        if not mergeable or rng.random() < 0.6:
            delta = {}
            deltas.append(delta)
        if key == "tool_calls":
            delta.setdefault("tool_calls", []).append(piece)
        else:
            delta[key] = piece
    entries: list[Json] = [
        {"index": choice["index"], "delta": d, "logprobs": None, "finish_reason": None}
        for d in deltas
    ]
    logprobs = choice.get("logprobs")
    if logprobs is not None:
        _spread_logprobs(logprobs, entries, rng)
    if rng.random() < 0.5:
        entries.append(
            {"index": choice["index"], "delta": {}, "logprobs": None, "finish_reason": None}
        )
    entries[-1]["finish_reason"] = choice["finish_reason"]
    return entries


def _spread_logprobs(logprobs: Json, entries: list[Json], rng: random.Random) -> None:
    """Attach slices of the logprobs lists to the entries, in order. The first entry always
    carries the logprobs object, so that the choice's logprobs exist even when its lists are
    null or empty; later entries carry it only when they have a slice."""
    parts: list[Json] = [dict.fromkeys(logprobs) for _ in entries]
    for key, value in logprobs.items():
        if value is None:
            continue
        slices = _cut_list(value, rng)
        positions = sorted(rng.randrange(len(entries)) for _ in slices)
        for position, piece in zip(positions, slices, strict=True):
            held = parts[position][key]
            parts[position][key] = piece if held is None else held + piece
    for position, (entry, part) in enumerate(zip(entries, parts, strict=True)):
        if position == 0 or any(v is not None for v in part.values()):
            entry["logprobs"] = part


def completion_to_chunks(
    completion: Json, *, include_usage: bool, rng: random.Random
) -> list[Json]:
    """The `chat.completion.chunk` dicts that stream `completion`, usage chunk last when
    `include_usage` (and then `usage: null` on every other chunk, as OpenAI sends)."""
    envelope: Json = {
        "id": completion["id"],
        "object": "chat.completion.chunk",
        "created": completion["created"],
        "model": completion["model"],
    }
    for key in ("service_tier", "system_fingerprint"):
        if key in completion:
            envelope[key] = completion[key]
    per_choice = [_choice_chunks(choice, rng) for choice in completion["choices"]]
    entries = _interleave(per_choice, rng)
    chunks: list[Json] = []
    for entry in entries:
        last = chunks[-1]["choices"] if chunks else None
        # Rarely, several choices share one chunk (never two entries of the same choice).
        if last and rng.random() < 0.15 and all(c["index"] != entry["index"] for c in last):
            last.append(entry)
            continue
        chunk = {**envelope, "choices": [entry]}
        if include_usage:
            chunk["usage"] = None
        chunks.append(chunk)
    if include_usage:
        chunks.append({**envelope, "choices": [], "usage": completion["usage"]})
    return chunks


def chunks_to_sse(chunks: Iterable[Json], *, done: bool = True) -> bytes:
    """The SSE body OpenAI sends: `data: {json}\\n\\n` per chunk, then `data: [DONE]`."""
    body = b"".join(b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks)
    return body + b"data: [DONE]\n\n" if done else body


def cut_bytes(data: bytes, rng: random.Random, *, max_piece: int = 64) -> list[bytes]:
    """`data` in random pieces of 1..max_piece bytes, as a network would deliver it."""
    pieces = []
    pos = 0
    while pos < len(data):
        size = rng.randint(1, max_piece)
        pieces.append(data[pos : pos + size])
        pos += size
    return pieces


# --- hypothesis strategies -------------------------------------------------------------

_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
_token = st.text(max_size=6)
_logprob = st.floats(max_value=0.0, allow_nan=False, allow_infinity=False)


@st.composite
def _token_logprob(draw: st.DrawFn, *, top: int) -> Json:
    token = draw(_token)
    entry: Json = {
        "token": token,
        "logprob": draw(_logprob),
        "bytes": draw(st.one_of(st.none(), st.just(list(token.encode())))),
    }
    if top >= 0:
        entry["top_logprobs"] = [draw(_token_logprob(top=-1)) for _ in range(top)]
    return entry


@st.composite
def _logprobs(draw: st.DrawFn, *, content: str | None, refusal: str | None) -> Json | None:
    if not draw(st.booleans()):
        return None
    top = draw(st.integers(0, 3))
    token_lists = st.lists(_token_logprob(top=top), max_size=5)
    return {
        "content": None if content is None else draw(token_lists),
        "refusal": None if refusal is None else draw(token_lists),
    }


@st.composite
def _tool_call(draw: st.DrawFn, index: int) -> Json:
    return {
        "id": f"call_{index}_" + draw(st.text("abcdefXYZ0189", min_size=1, max_size=8)),
        "type": "function",
        "function": {
            "name": draw(st.sampled_from(["get_weather", "get_stock_price", "lookup"])),
            "arguments": draw(_text),
        },
    }


@st.composite
def _choice(draw: st.DrawFn, index: int) -> Json:
    kind = draw(st.sampled_from(["content", "refusal", "tools", "empty"]))
    content = draw(_text) if kind in ("content", "tools") and draw(st.booleans()) else None
    if kind == "content" and content is None:
        content = draw(_text)
    refusal = draw(_text) if kind == "refusal" else None
    message: Json = {"role": "assistant", "content": content, "refusal": refusal}
    if kind == "tools":
        count = draw(st.integers(1, 3))
        message["tool_calls"] = [draw(_tool_call(i)) for i in range(count)]
    finish = "tool_calls" if kind == "tools" else draw(st.sampled_from(["stop", "length"]))
    return {
        "index": index,
        "message": message,
        "logprobs": draw(_logprobs(content=content, refusal=refusal)),
        "finish_reason": finish,
    }


@st.composite
def _usage(draw: st.DrawFn) -> Json:
    prompt, completion = draw(st.integers(0, 10**6)), draw(st.integers(0, 10**6))
    usage: Json = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if draw(st.booleans()):
        usage["prompt_tokens_details"] = {"cached_tokens": draw(st.integers(0, prompt))}
        usage["completion_tokens_details"] = {
            "reasoning_tokens": draw(st.integers(0, completion)),
            "accepted_prediction_tokens": 0,
        }
    return usage


@st.composite
def completions(draw: st.DrawFn, *, max_choices: int = 3) -> Json:
    """Random non-streaming `chat.completion` objects: n choices of content, refusal or
    parallel tool calls, optional logprobs (with top_logprobs) on content and refusal,
    usage with or without details, optional system_fingerprint and service_tier."""
    n = draw(st.integers(1, max_choices))
    completion: Json = {
        "id": "chatcmpl-" + draw(st.text("ABCDEFabcdef0123456789", min_size=1, max_size=12)),
        "object": "chat.completion",
        "created": draw(st.integers(1, 2**31)),
        "model": draw(st.sampled_from(["gpt-4o-2024-08-06", "gpt-4o-mini", "llama3"])),
        "choices": [draw(_choice(i)) for i in range(n)],
        "usage": draw(_usage()),
    }
    if draw(st.booleans()):
        completion["system_fingerprint"] = draw(st.one_of(st.none(), st.just("fp_845eaabc1f")))
    if draw(st.booleans()):
        completion["service_tier"] = "default"
    return completion
