"""Reassembles a legacy `/completions` stream (`text_completion` chunks) into the object a
non-streaming call returns. Pure, like `chat.py`, with the same surface
(`endpoints.Assembler`): `add(event) -> bool`, `usage`, `error`, `result()`. Logprobs are kept
as the chunks gave them: legacy lists, or chat-style `content` entries (llama.cpp's server).
"""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]


class CompletionAssembler:
    def __init__(self) -> None:
        self._head: Json = {}
        self._choices: dict[int, Json] = {}
        self._texts: dict[int, list[str]] = {}
        self._usage: Json | None = None

    @property
    def usage(self) -> Json | None:
        return self._usage

    @property
    def error(self) -> Any:
        """Completion streams report errors only as `error` events."""
        return None

    def add(self, chunk: Json) -> bool:
        for key in ("id", "created", "model"):
            if key not in self._head and chunk.get(key):
                self._head[key] = chunk[key]
        if chunk.get("system_fingerprint") is not None:
            self._head["system_fingerprint"] = chunk["system_fingerprint"]
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        produced = False
        for delta in chunk.get("choices") or ():
            if not isinstance(delta, dict):
                continue
            index = delta.get("index", 0)
            choice = self._choices.setdefault(
                index, {"index": index, "logprobs": None, "finish_reason": None}
            )
            text = delta.get("text")
            if isinstance(text, str) and text:
                self._texts.setdefault(index, []).append(text)
                produced = True
            if delta.get("finish_reason") is not None:
                choice["finish_reason"] = delta["finish_reason"]
            logprobs = delta.get("logprobs")
            if isinstance(logprobs, dict):
                _fold_logprobs(choice, logprobs)
        return produced

    def result(self) -> Json:
        choices = []
        for index in sorted(self._choices):
            choice = self._choices[index]
            text = "".join(self._texts.get(index, ()))
            choices.append({"text": text, **choice})
        out: Json = {"id": self._head.get("id"), "object": "text_completion"}
        out["created"] = self._head.get("created")
        out["model"] = self._head.get("model")
        if "system_fingerprint" in self._head:
            out["system_fingerprint"] = self._head["system_fingerprint"]
        out["choices"] = choices
        if self._usage is not None:
            out["usage"] = self._usage
        return out


def _fold_logprobs(choice: Json, logprobs: Json) -> None:
    """A chunk's logprobs into its choice's: lists extend, whatever their keys (the legacy
    `tokens`, `token_logprobs`, `top_logprobs`, `text_offset`, or chat-style `content` as
    llama.cpp streams them); other values keep the last non-null; keys never given stay out."""
    merged = choice["logprobs"]
    if merged is None:
        merged = choice["logprobs"] = {}
    for key, value in logprobs.items():
        held = merged.get(key)
        if isinstance(value, list):
            if isinstance(held, list):
                held.extend(value)
            else:
                merged[key] = list(value)
        elif value is not None or key not in merged:
            merged[key] = value
