"""Reassemblers for the streaming endpoints other than chat completions. Pure, like
`assemble.py`, with the same surface: `add(event) -> bool`, `usage`, `result()`.

- `CompletionAssembler`: legacy `/completions` (`text_completion` chunks) into the object a
  non-streaming call returns.
- `ResponsesAssembler`: Responses API events. A finished stream carries the whole response in
  its terminal event, and that is the record; a stream cut short is rebuilt from the last
  snapshot, the finished output items and the text deltas received so far.
"""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]

TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})
_LOGPROB_LISTS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")


class CompletionAssembler:
    def __init__(self) -> None:
        self._head: Json = {}
        self._choices: dict[int, Json] = {}
        self._texts: dict[int, list[str]] = {}
        self._usage: Json | None = None

    @property
    def usage(self) -> Json | None:
        return self._usage

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
                merged = choice["logprobs"] = choice["logprobs"] or {k: [] for k in _LOGPROB_LISTS}
                for key in _LOGPROB_LISTS:
                    merged[key].extend(logprobs.get(key) or ())
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


class ResponsesAssembler:
    def __init__(self) -> None:
        self._snapshot: Json | None = None
        self._final: Json | None = None
        self._items: dict[int, Json] = {}
        self._texts: dict[tuple[int, int], list[str]] = {}
        self._arguments: dict[int, list[str]] = {}
        self.error: Any = None

    @property
    def finished(self) -> bool:
        return self._final is not None

    @property
    def usage(self) -> Json | None:
        source = self._final or self._snapshot or {}
        usage = source.get("usage")
        return usage if isinstance(usage, dict) else None

    def add(self, event: Json) -> bool:
        kind = event.get("type")
        response = event.get("response")
        if isinstance(response, dict):
            self._snapshot = response
            if kind in TERMINAL_EVENTS:
                self._final = response
                if kind == "response.failed" and response.get("error"):
                    self.error = response["error"]
        if kind == "error":
            self.error = {k: v for k, v in event.items() if k != "type"}
        index = event.get("output_index")
        if not isinstance(index, int):
            return False
        if kind in ("response.output_item.added", "response.output_item.done"):
            item = event.get("item")
            if isinstance(item, dict):
                self._items[index] = item
        elif kind == "response.output_text.delta":
            delta = event.get("delta")
            if isinstance(delta, str) and delta:
                self._texts.setdefault((index, event.get("content_index", 0)), []).append(delta)
                return True
        elif kind == "response.function_call_arguments.delta":
            delta = event.get("delta")
            if isinstance(delta, str) and delta:
                self._arguments.setdefault(index, []).append(delta)
                return True
        return False

    def output_text(self) -> str:
        """All text the model produced, in output order (what the SDK calls `output_text`)."""
        if self._final is not None:
            return "".join(
                part.get("text", "")
                for item in self._final.get("output") or ()
                if isinstance(item, dict) and item.get("type") == "message"
                for part in item.get("content") or ()
                if isinstance(part, dict) and part.get("type") == "output_text"
            )
        return "".join("".join(self._texts[key]) for key in sorted(self._texts))

    def result(self) -> Json | None:
        if self._final is not None:
            return self._final
        if self._snapshot is None and not self._items and not self._texts:
            return None
        out: Json = dict(self._snapshot or {"object": "response"})
        output = []
        for index in sorted(set(self._items) | {i for i, _ in self._texts} | set(self._arguments)):
            item = dict(self._items.get(index) or {"type": "message", "role": "assistant"})
            if item.get("type") == "function_call" and index in self._arguments:
                item.setdefault("arguments", "".join(self._arguments[index]))
            parts = {k: "".join(v) for (i, k), v in self._texts.items() if i == index}
            if parts and not item.get("content"):
                item["content"] = [
                    {"type": "output_text", "text": parts[k], "annotations": []}
                    for k in sorted(parts)
                ]
            output.append(item)
        out["output"] = output
        return out
