"""The one usage decoder: every endpoint's usage object as the token classes prices name.

OpenAI reports usage in three shapes. Chat Completions, legacy completions and embeddings
say `prompt_tokens`/`completion_tokens` with `prompt_tokens_details`/
`completion_tokens_details`; the Responses API, image generation and transcription say
`input_tokens`/`output_tokens` with `input_tokens_details`/`output_tokens_details`; the
Realtime API says `input_token_details`/`output_token_details`, and splits its cached tokens
by modality in `input_token_details.cached_tokens_details`. `decode_usage` reads all three
into one `Usage`, once per exchange when it completes; rows, metrics, traces, the console,
compare and pricing read that.

Every class is a count of tokens inside a total, as OpenAI documents it: cached tokens are
part of the input, reasoning tokens part of the output, audio and image tokens part of the
input or output they arrive in, cached audio part of both the cached and the audio input. A
detail that claims more than the total it is part of is cut to that total, so no class is
ever negative and a cost never exceeds what the reported totals allow.

Pure: no I/O; garbage gives None or zero counts, never an exception.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeGuard


class Usage(NamedTuple):
    """Token counts of one exchange; each detail is part of the total it follows.

    A named tuple: one is made per exchange on the record's path, and it is cheap to build."""

    input: int
    """All input (prompt) tokens: cached, audio and image ones included."""
    cached: int
    """Input tokens read from the prompt cache, every modality."""
    cache_write: int
    """Input tokens written to the prompt cache, where a provider reports and bills them."""
    input_audio: int
    cached_audio: int
    """Audio input tokens read from the cache (part of `cached` and of `input_audio`)."""
    input_image: int
    cached_image: int
    output: int
    """All output (completion) tokens: reasoning, audio and image ones included."""
    reasoning: int
    output_audio: int
    output_image: int
    total: int | None = None
    """`total_tokens` as reported (None when absent); not used for pricing."""
    accepted_prediction: int | None = None
    rejected_prediction: int | None = None


def _count(value: Any) -> int | None:
    """A token count as sent, or None unless it is a non-negative whole number."""
    if type(value) is int:  # nearly always
        return value if value >= 0 else None
    if isinstance(value, bool):  # bool is an int subclass; True is no count
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and value >= 0:
        return int(value)
    return None


def _is_mapping(value: Any) -> TypeGuard[Mapping[str, Any]]:
    # `isinstance(x, Mapping)` goes through the ABC machinery; JSON gives plain dicts.
    return type(value) is dict or (value is not None and isinstance(value, Mapping))


_EMPTY: Mapping[str, Any] = {}


def _details(usage: Mapping[str, Any], *names: str) -> Mapping[str, Any]:
    """The first details table of `names` the usage has; empty when none."""
    for name in names:
        found = usage.get(name)
        if _is_mapping(found):
            return found
    return _EMPTY


def _part(details: Mapping[str, Any], name: str, whole: int) -> int:
    """A detail's count, 0 when absent or not a count, cut to `whole`."""
    value = details.get(name)
    if type(value) is not int:  # nearly always an int or absent
        value = _count(value) if value is not None else 0
        if value is None:
            return 0
    return value if 0 <= value <= whole else (whole if value > whole else 0)


def decode_usage(usage: Any) -> Usage | None:
    """`Usage` from a usage object of any endpoint; None when there is none or its shape is
    unknown (a transcription billed by duration, a vendor's own shape)."""
    if not _is_mapping(usage):
        return None
    total = _count(usage.get("prompt_tokens"))
    if total is not None:  # chat/completions, legacy completions, embeddings
        output = _count(usage.get("completion_tokens")) or 0
        ins = _details(usage, "prompt_tokens_details")
        outs = _details(usage, "completion_tokens_details")
    else:  # Responses, images, transcriptions, Realtime
        total = _count(usage.get("input_tokens"))
        if total is None:
            return None
        output = _count(usage.get("output_tokens")) or 0
        ins = _details(usage, "input_tokens_details", "input_token_details")
        outs = _details(usage, "output_tokens_details", "output_token_details")
    return _decoded(usage, total, output, ins, outs)


def _decoded(
    usage: Mapping[str, Any],
    total: int,
    output: int,
    ins: Mapping[str, Any],
    outs: Mapping[str, Any],
) -> Usage:
    cached = audio = image = write = cached_audio = cached_image = 0
    if ins:
        cached = _part(ins, "cached_tokens", total)
        audio = _part(ins, "audio_tokens", total)
        image = _part(ins, "image_tokens", total)
        write = _part(ins, "cache_write_tokens", total - cached)
        # Realtime splits cached tokens by modality; each split is part of both its modality
        # and the cached tokens.
        split = ins.get("cached_tokens_details")
        if split and _is_mapping(split):
            cached_audio = _part(split, "audio_tokens", min(cached, audio))
            cached_image = _part(split, "image_tokens", min(cached, image))
    reasoning = output_audio = output_image = 0
    accepted = rejected = None
    if outs:
        reasoning = _part(outs, "reasoning_tokens", output)
        output_audio = _part(outs, "audio_tokens", output)
        output_image = _part(outs, "image_tokens", output)
        accepted = _count(outs.get("accepted_prediction_tokens"))
        rejected = _count(outs.get("rejected_prediction_tokens"))
    return Usage(
        total, cached, write, audio, cached_audio, image, cached_image,
        output, reasoning, output_audio, output_image,
        _count(usage.get("total_tokens")), accepted, rejected,
    )  # fmt: skip
