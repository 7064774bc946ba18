"""Reassembles a Responses API stream. Pure, like `chat.py`, with the same surface
(`endpoints.Assembler`): `add(event) -> bool`, `usage`, `error`, `result()`.

Responses API events: A finished stream carries the whole response in
  its terminal event, and that is the record. A stream cut short is rebuilt from the last
  snapshot, the finished output items (`response.output_item.done`) and, for items not
  finished, every string received so far (text, refusal, reasoning and its summary, function
  arguments); a terminal event without `output` gets its items rebuilt the same way, as the
  SDK's `get_final_response()` does.
"""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]

TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponsesAssembler:
    def __init__(self) -> None:
        self._snapshot: Json | None = None
        self._final: Json | None = None
        self._items: dict[int, Json] = {}
        self._finished_items: set[int] = set()
        """Output indexes whose `response.output_item.done` came: that item is whole."""
        self._strings: dict[_Place, list[str]] = {}
        """The deltas of each string being streamed, or its whole text once its `.done` came."""
        self._parts: dict[_Place, Json] = {}
        """Content and summary parts as their `part.added` / `part.done` events gave them."""
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
        """Fold one event in. True when it carried generated output of any kind (text,
        refusal, reasoning or its summary, a tool call's name or input, audio): the first
        token."""
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
        if kind in _UNPLACED_OUTPUT:
            delta = event.get("delta")
            return isinstance(delta, str) and delta != ""
        index = event.get("output_index")
        if not isinstance(index, int) or not isinstance(kind, str):
            return False
        if kind in ("response.output_item.added", "response.output_item.done"):
            item = event.get("item")
            if not isinstance(item, dict):
                return False
            self._items[index] = item
            if kind == "response.output_item.done":
                self._finished_items.add(index)
                return False
            return bool(item.get("name"))  # a tool call's name is generated, as in chat
        if kind in _PART_EVENTS:
            part = event.get("part")
            if isinstance(part, dict):
                self._parts[_place(event, _PART_EVENTS[kind])] = part
            return False
        string = _STRINGS.get(kind.rpartition(".")[0])
        if string is None:
            return False
        place = _place(event, string)
        if string in ("content", "summary") and place not in self._parts:
            self._parts[place] = _new_part(kind)
        if kind.endswith(".delta"):
            delta = event.get("delta")
            if isinstance(delta, str) and delta:
                self._strings.setdefault(place, []).append(delta)
                return True
        elif kind.endswith(".done"):
            whole = event.get(_DONE_KEYS.get(kind, "text"))
            if isinstance(whole, str):
                self._strings[place] = [whole]
        return False

    def output_text(self) -> str:
        """All text the model produced, in output order (what the SDK calls `output_text`)."""
        result = self.result() or {}
        return "".join(
            part.get("text", "")
            for item in result.get("output") or ()
            if isinstance(item, dict) and item.get("type") == "message"
            for part in item.get("content") or ()
            if isinstance(part, dict) and part.get("type") == "output_text"
        )

    def result(self) -> Json | None:
        if self._final is not None:
            if self._final.get("output") or not self._items:
                return self._final
            return {**self._final, "output": self._output()}
        if self._snapshot is None and not self._items and not self._strings:
            return None
        out: Json = dict(self._snapshot or {"object": "response"})
        out["output"] = self._output()
        return out

    def _output(self) -> list[Json]:
        """The output items: whole where they finished, else built from what streamed."""
        places_of: dict[int, list[_Place]] = {index: [] for index in self._items}
        for place in sorted({*self._strings, *self._parts}):
            places_of.setdefault(place[0], []).append(place)
        output = []
        for index, places in sorted(places_of.items()):
            if index in self._finished_items:
                output.append(self._items[index])
                continue
            item = dict(self._items.get(index) or self._bare_item(places[0]))
            lists: dict[str, list[Json]] = {}
            for place in places:
                key = place[1]
                text = "".join(self._strings[place]) if place in self._strings else None
                if key in ("content", "summary"):
                    part = dict(self._parts[place])
                    if text is not None:
                        part["refusal" if part.get("type") == "refusal" else "text"] = text
                    lists.setdefault(key, []).append(part)
                elif text is not None:
                    item[key] = text
            item.update(lists)
            output.append(item)
        return output

    def _bare_item(self, place: _Place) -> Json:
        """The item a string goes to when its `output_item.added` never came."""
        part = self._parts.get(place) or {}
        if part.get("type") in ("reasoning_text", "summary_text"):
            return {"type": "reasoning"}
        return dict(_ITEM_FOR[place[1]])


_Place = tuple[int, str, int]
"""Where a streamed string goes: (output index, item key, index in that key's list)."""

_STRINGS = {
    "response.output_text": "content",
    "response.refusal": "content",
    "response.reasoning_text": "content",
    "response.reasoning_summary_text": "summary",
    "response.function_call_arguments": "arguments",
    "response.mcp_call_arguments": "arguments",
    "response.custom_tool_call_input": "input",
    "response.code_interpreter_call_code": "code",
}
"""Events (less `.delta` / `.done`) that stream a string, and the item key it goes to."""
_DONE_KEYS = {
    "response.refusal.done": "refusal",
    "response.function_call_arguments.done": "arguments",
    "response.mcp_call_arguments.done": "arguments",
    "response.custom_tool_call_input.done": "input",
    "response.code_interpreter_call_code.done": "code",
}
"""Where a `.done` event has the whole string, when not in `text`."""
_PART_EVENTS = {
    "response.content_part.added": "content",
    "response.content_part.done": "content",
    "response.reasoning_summary_part.added": "summary",
    "response.reasoning_summary_part.done": "summary",
}
_UNPLACED_OUTPUT = frozenset({"response.audio.delta", "response.audio.transcript.delta"})
"""Output deltas that belong to no output item."""
_ITEM_FOR: dict[str, Json] = {
    "content": {"type": "message", "role": "assistant"},
    "arguments": {"type": "function_call"},
    "input": {"type": "custom_tool_call"},
    "code": {"type": "code_interpreter_call"},
}
"""The item a string goes to when its `output_item.added` never came."""


def _place(event: Json, key: str) -> _Place:
    sub = event.get("summary_index" if key == "summary" else "content_index", 0)
    return (event["output_index"], key, sub if isinstance(sub, int) else 0)


def _new_part(kind: str) -> Json:
    """The part a string streams into when its `part.added` event never came."""
    if kind.startswith("response.refusal."):
        return {"type": "refusal", "refusal": ""}
    if kind.startswith("response.reasoning_text."):
        return {"type": "reasoning_text", "text": ""}
    if kind.startswith("response.reasoning_summary_text."):
        return {"type": "summary_text", "text": ""}
    return {"type": "output_text", "text": "", "annotations": []}
