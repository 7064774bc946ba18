"""A text completion's logprobs as the chat-style tokens the `logprobs` table keeps.

`/v1/completions` answers with legacy lists (`tokens`, `token_logprobs`, `top_logprobs` as
`{token: logprob}` objects, `text_offset`: OpenAI) or with chat-style `content` entries
(`{token, logprob, bytes, top_logprobs}`: llama.cpp's server); either becomes one list of
chat-style entries per choice, so the console shows completions' logprobs as it does chats'.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def completion_tokens(response: dict[str, Any]) -> Iterator[tuple[int, list[Any]]]:
    """(choice index, chat-style token entries) for each choice of a `text_completion` that
    has logprobs."""
    choices = response.get("choices")
    for position, choice in enumerate(choices if isinstance(choices, list) else []):
        if not isinstance(choice, dict) or not isinstance(choice.get("logprobs"), dict):
            continue
        index = choice.get("index")
        index = index if isinstance(index, int) and not isinstance(index, bool) else position
        logprobs = choice["logprobs"]
        content = logprobs.get("content")
        if isinstance(content, list):
            yield index, content
        elif isinstance(logprobs.get("tokens"), list):
            yield index, _from_lists(logprobs)


def _from_lists(logprobs: dict[str, Any]) -> list[Any]:
    tokens = logprobs["tokens"]
    values = _list(logprobs.get("token_logprobs"), len(tokens))
    tops = _list(logprobs.get("top_logprobs"), len(tokens))
    entries = []
    for token, value, top in zip(tokens, values, tops, strict=True):
        entry: dict[str, Any] = {"token": token, "logprob": value}
        if isinstance(top, dict):
            entry["top_logprobs"] = [{"token": t, "logprob": lp} for t, lp in top.items()]
        entries.append(entry)
    return entries


def _list(found: Any, length: int) -> list[Any]:
    """`found` as a list of `length` items (None where it has none)."""
    items = list(found) if isinstance(found, list) else []
    return (items + [None] * length)[:length]
