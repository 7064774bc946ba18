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
_new_tuple = tuple.__new__
"""Makes a named tuple from all its values, as its own `__new__` does, without the Python
call that `__new__` is (one `Usage` per exchange)."""


def _details(usage: Mapping[str, Any], *names: str) -> Mapping[str, Any]:
    """The first details table of `names` the usage has; empty when none."""
    for name in names:
        found = usage.get(name)
        if found is not None:
            return found if _is_mapping(found) else _EMPTY
    return _EMPTY


def _cut(value: Any, whole: int) -> int:
    """A detail that is not a plain count within its whole: as a count (0 if it is none),
    cut to the whole. The fast path (a plain int within it) is written out by the caller."""
    found = _count(value)
    return 0 if found is None else min(found, whole)


def _split(split: Any, cached: int, audio: int, image: int) -> tuple[int, int]:
    """Realtime's cached audio and image tokens (`cached_tokens_details`), each within the
    cached tokens and the tokens of its modality."""
    if not _is_mapping(split):
        return 0, 0
    return (
        _cut(split.get("audio_tokens"), min(cached, audio)),
        _cut(split.get("image_tokens"), min(cached, image)),
    )


def _input_output(
    usage: Mapping[str, Any],
) -> tuple[int, int, Mapping[str, Any], Mapping[str, Any]] | None:
    """The totals and details tables of the Responses shape (`input_tokens`, also images,
    transcriptions and Realtime); None when it has no input count."""
    total = _count(usage.get("input_tokens"))
    if total is None:
        return None
    output = _count(usage.get("output_tokens")) or 0
    ins = _details(usage, "input_tokens_details", "input_token_details")
    outs = _details(usage, "output_tokens_details", "output_token_details")
    return total, output, ins, outs


def decode_usage(usage: Any) -> Usage | None:
    """`Usage` from a usage object of any endpoint; None when there is none or its shape is
    unknown (a transcription billed by duration, a vendor's own shape)."""
    if type(usage) is not dict and not _is_mapping(usage):
        return None
    # Each count: a plain non-negative int (nearly always), else `_count`, written out.
    total = usage.get("prompt_tokens")
    if type(total) is not int or total < 0:
        total = _count(total)
    if total is not None:  # chat/completions, legacy completions, embeddings
        output = usage.get("completion_tokens")
        if type(output) is not int or output < 0:
            output = _count(output) or 0
        ins = usage.get("prompt_tokens_details")
        if type(ins) is not dict:
            ins = _details(usage, "prompt_tokens_details")
        outs = usage.get("completion_tokens_details")
        if type(outs) is not dict:
            outs = _details(usage, "completion_tokens_details")
    else:  # Responses, images, transcriptions, Realtime
        found = _input_output(usage)
        if found is None:
            return None
        total, output, ins, outs = found
    # Each detail: a plain int within its whole (nearly always), else `_cut`.
    get = ins.get
    cached = get("cached_tokens", 0)
    if type(cached) is not int or not 0 <= cached <= total:
        cached = _cut(cached, total)
    audio = get("audio_tokens", 0)
    if type(audio) is not int or not 0 <= audio <= total:
        audio = _cut(audio, total)
    image = get("image_tokens", 0)
    if type(image) is not int or not 0 <= image <= total:
        image = _cut(image, total)
    write = get("cache_write_tokens", 0)
    if type(write) is not int or not 0 <= write <= total - cached:
        write = _cut(write, total - cached)
    split = get("cached_tokens_details")  # Realtime: cached tokens by modality
    cached_audio, cached_image = (0, 0) if split is None else _split(split, cached, audio, image)
    get = outs.get
    reasoning = get("reasoning_tokens", 0)
    if type(reasoning) is not int or not 0 <= reasoning <= output:
        reasoning = _cut(reasoning, output)
    output_audio = get("audio_tokens", 0)
    if type(output_audio) is not int or not 0 <= output_audio <= output:
        output_audio = _cut(output_audio, output)
    output_image = get("image_tokens", 0)
    if type(output_image) is not int or not 0 <= output_image <= output:
        output_image = _cut(output_image, output)
    whole = usage.get("total_tokens")
    if type(whole) is not int or whole < 0:
        whole = _count(whole)
    accepted, rejected = get("accepted_prediction_tokens"), get("rejected_prediction_tokens")
    if accepted is not None or rejected is not None:
        accepted, rejected = _count(accepted), _count(rejected)
    return _new_tuple(Usage, (
        total, cached, write, audio, cached_audio, image, cached_image,
        output, reasoning, output_audio, output_image, whole, accepted, rejected,
    ))  # fmt: skip
