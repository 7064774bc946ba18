"""Reassembles a streamed chat completion into the object a non-streaming call returns.

The forwarder parses each SSE data line with orjson and hands the `chat.completion.chunk`
dict to `ChatAssembler.add`; at the end (or whenever the stream stops, however it stops)
`result()` gives the `chat.completion` that is stored as the exchange's response.

Pure and cheap: strings are kept as lists of parts and joined only in `result()`, chunks are
never copied, so folding a chunk costs a few microseconds. Vendors bend the chunk format in
many ways (Azure filter chunks, Ollama's repeated role, vLLM and llama.cpp extras, deltas
without `index`); the rules below keep every piece of data and drop only padding. Unknown
keys follow one rule: strings in a delta append, lists in a delta extend, any other value
(and every unknown choice-level or top-level key) keeps its last non-null value. A key the
stream never carried is not in the record: `content` and `refusal` of a message, a choice's
`logprobs` and the lists in it appear only where a chunk had them, null or not (OpenAI's
streams name them all; llama.cpp's name no `refusal`).
"""

from __future__ import annotations

from typing import Any

# `id`, `created` and `model` come from the first chunk carrying a real (truthy) value, since
# Azure's content-filter chunk carries `id: ""`, `created: 0`, `model: ""`.
_HEAD = ("id", "created", "model")
# Delta strings that count as generated output for time-to-first-token.
_OUTPUT_TEXT = frozenset({"content", "refusal", "reasoning_content", "reasoning"})


class _Text(list[str]):
    """Parts of a string being streamed, joined in `result()`; a type of its own so that a
    list-valued extra (extended in place) is never mistaken for text."""


def _finish(value: Any) -> Any:
    if type(value) is _Text:
        return "".join(value)
    if type(value) is list:
        return list(value)
    if type(value) is dict:
        return {k: _finish(v) for k, v in value.items()}
    return value


def _fold(acc: dict[str, Any], key: str, value: Any) -> None:
    """The general rule for a streamed field: strings append, lists extend, else last non-null."""
    if value is None:
        acc.setdefault(key, None)
        return
    old = acc.get(key)
    if type(value) is str:
        if type(old) is _Text:
            old.append(value)
        else:
            acc[key] = _Text((value,))
    elif type(value) is list:
        if type(old) is list:
            old.extend(value)
        else:
            acc[key] = list(value)
    else:
        acc[key] = value


class _ToolCall:
    __slots__ = ("fields", "id", "index", "seq", "type")

    def __init__(self, index: int, seq: int) -> None:
        self.index = index
        self.seq = seq
        self.id: str | None = None
        self.type: str | None = None
        # `function` (or another tool type's object, e.g. `custom`): `name` is set once,
        # `arguments` / `input` strings append.
        self.fields: dict[str, Any] = {}

    def add(self, delta: dict[str, Any]) -> bool:
        output = False
        for key, value in delta.items():
            if key == "index" or value is None:
                continue
            if key == "id":
                self.id = self.id or value
            elif key == "type":
                self.type = self.type or value
            elif type(value) is dict:
                sub = self.fields.get(key)
                if type(sub) is not dict:
                    sub = self.fields[key] = {}
                for name, part in value.items():
                    if name == "name":
                        if part and not sub.get("name"):
                            sub["name"] = part
                            output = True
                    else:
                        _fold(sub, name, part)
                        output = output or (type(part) is str and part != "")
            else:
                self.fields[key] = value
        return output

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "type": self.type or "function"}
        for key, value in self.fields.items():
            out[key] = _finish(value)
        function = out.get("function")
        if type(function) is dict:
            function.setdefault("name", None)
            function.setdefault("arguments", "")
        return out


class _Choice:
    __slots__ = (
        "content",
        "extra",
        "finish_reason",
        "index",
        "last_tool",
        "logprobs",
        "message_extra",
        "refusal",
        "role",
        "seen",
        "tools",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.role: str | None = None
        self.content: _Text | None = None
        self.refusal: _Text | None = None
        self.tools: dict[tuple[int, int], _ToolCall] = {}
        self.last_tool: _ToolCall | None = None
        # Delta keys beyond role/content/refusal/tool_calls: function_call, audio, vendors'.
        self.message_extra: dict[str, Any] = {}
        self.logprobs: dict[str, Any] | None = None
        self.finish_reason: str | None = None
        self.extra: dict[str, Any] = {}
        self.seen: set[str] = set()
        """Which of `content`, `refusal` (in a delta) and `logprobs` the stream carried, null
        or not: a key it never carried is not in the record."""

    def add(self, choice: dict[str, Any]) -> bool:
        output = False
        for key, value in choice.items():
            if key == "delta" or key == "message":
                if value:
                    output = self._delta(value)
            elif key == "logprobs":
                self.seen.add(key)
                if value is not None:
                    self._logprobs(value)
            elif key == "finish_reason":
                if value is not None:
                    self.finish_reason = value
            elif key not in ("index", "obfuscation") and (
                value is not None or key not in self.extra
            ):
                self.extra[key] = value
        return output

    def _delta(self, delta: dict[str, Any]) -> bool:
        output = False
        for key, value in delta.items():
            if key == "content":
                self.seen.add(key)
                if value is not None:
                    if self.content is None:
                        self.content = _Text()
                    self.content.append(value)
                    output = output or value != ""
            elif key == "role":
                if value:
                    self.role = value
            elif key == "tool_calls":
                if value:
                    output = self._tool_calls(value) or output
            elif key == "refusal":
                self.seen.add(key)
                if value is not None:
                    if self.refusal is None:
                        self.refusal = _Text()
                    self.refusal.append(value)
                    output = output or value != ""
            elif key == "obfuscation":
                continue
            elif type(value) is dict and key in ("function_call", "audio"):
                acc = self.message_extra.get(key)
                if type(acc) is not dict:
                    acc = self.message_extra[key] = {}
                for name, part in value.items():
                    if key == "function_call" and name == "name":
                        if part and not acc.get("name"):
                            acc["name"] = part
                            output = True
                    elif name in ("id", "expires_at"):
                        if part is not None or name not in acc:
                            acc[name] = part
                    else:
                        _fold(acc, name, part)
                        output = output or (type(part) is str and part != "")
            elif value is not None or key not in ("function_call", "audio"):
                _fold(self.message_extra, key, value)
                output = output or (key in _OUTPUT_TEXT and type(value) is str and value != "")
        return output

    def _tool_calls(self, deltas: list[dict[str, Any]]) -> bool:
        output = False
        for delta in deltas:
            given: int | None = delta.get("index")
            new_id = delta.get("id")
            call = self.last_tool
            if given is None:
                # Some vendors omit `index`: the delta continues the last call, unless it
                # opens a new one by carrying a new id.
                if call is not None and not (new_id and call.id and new_id != call.id):
                    output = call.add(delta) or output
                    continue
                index = 1 + max((key[0] for key in self.tools), default=-1)
                call = None
            else:
                index = given
                if call is None or call.index != index:
                    call = self._latest_tool(index)
                if call is not None and new_id and call.id and new_id != call.id:
                    # Same index, different id: a vendor reusing indexes; keep both calls.
                    call = None
            if call is None:
                call = _ToolCall(index, len(self.tools))
                self.tools[(index, call.seq)] = call
            self.last_tool = call
            output = call.add(delta) or output
        return output

    def _latest_tool(self, index: int) -> _ToolCall | None:
        found = None
        for call in self.tools.values():
            if call.index == index:
                found = call
        return found

    def _logprobs(self, logprobs: dict[str, Any]) -> None:
        # `content` / `refusal` stay None until a list arrives: None and [] mean different
        # things (no content at all vs. content without tokens). Only keys given appear.
        acc = self.logprobs
        if acc is None:
            acc = self.logprobs = {}
        for key, value in logprobs.items():
            _fold(acc, key, value)

    def result(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role or "assistant"}
        if "content" in self.seen:
            message["content"] = None if self.content is None else "".join(self.content)
        if "refusal" in self.seen:
            message["refusal"] = None if self.refusal is None else "".join(self.refusal)
        if self.tools:
            message["tool_calls"] = [self.tools[k].result() for k in sorted(self.tools)]
        for key, value in self.message_extra.items():
            message[key] = _finish(value)
        out: dict[str, Any] = {"index": self.index, "message": message}
        if "logprobs" in self.seen:
            logprobs = self.logprobs
            out["logprobs"] = (
                None if logprobs is None else {k: _finish(v) for k, v in logprobs.items()}
            )
        out["finish_reason"] = self.finish_reason
        out.update(self.extra)
        return out


class ChatAssembler:
    """Folds `chat.completion.chunk` dicts, in stream order, into one `chat.completion`."""

    __slots__ = ("_choices", "_extra", "_head", "_real", "_usage", "_usage_seen")

    def __init__(self) -> None:
        self._head: dict[str, Any] = dict.fromkeys(_HEAD)
        self._real: set[str] = set()
        self._choices: dict[int, _Choice] = {}
        self._usage: dict[str, Any] | None = None
        self._usage_seen = False
        self._extra: dict[str, Any] = {}

    def add(self, chunk: dict[str, Any]) -> bool:
        """Fold one parsed chunk in. True when it carried generated output (text, refusal,
        tool-call name or arguments, audio, reasoning): the first such chunk is the first
        token. A chunk not shaped like one (`choices` not a list of objects, a delta that is
        not an object) raises AttributeError or TypeError; what came before is kept."""
        output = False
        head, real, extra = self._head, self._real, self._extra  # read once: a loop per key
        for key, value in chunk.items():
            if key == "choices":
                if not value:
                    continue
                choices = self._choices
                for position, choice in enumerate(value):
                    index = choice.get("index", position)
                    state = choices.get(index)
                    if state is None:
                        state = choices[index] = _Choice(index)
                    output = state.add(choice) or output
            elif key in head:
                if key not in real:
                    if value:
                        head[key] = value
                        real.add(key)
                    elif head[key] is None:
                        head[key] = value
            elif key == "object" or key == "obfuscation":
                continue
            elif key == "usage":
                self._usage_seen = True
                if value is not None:
                    self._usage = value
            elif value is not None or key not in extra:
                extra[key] = value
        return output

    @property
    def usage(self) -> dict[str, Any] | None:
        """The last non-null usage the stream reported (vLLM may report it on every chunk)."""
        return self._usage

    @property
    def error(self) -> Any:
        """Chat streams report errors only as `error` events, which the reader sees itself."""
        return None

    def result(self) -> dict[str, Any]:
        """The `chat.completion` so far; a fresh object on every call."""
        out: dict[str, Any] = {
            "id": self._head["id"],
            "object": "chat.completion",
            "created": self._head["created"],
            "model": self._head["model"],
            "choices": [self._choices[i].result() for i in sorted(self._choices)],
        }
        if self._usage_seen:
            out["usage"] = _finish(self._usage)
        out.update(self._extra)
        return out
