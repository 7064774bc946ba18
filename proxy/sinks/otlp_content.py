"""What a span says of an exchange's content (`otlp_content = true`), as the GenAI semantic
conventions ask: the input messages, the system instructions, the output messages.

Chat completions already speak in messages: the request's `messages` go as they are, and each
choice's message gains its `index` and `finish_reason` (several choices stay told apart). The
Responses API speaks in items: its `input` (a string, or message, function call and function
call output items) and its `output` become messages in the same shape, and its `instructions`
go to `gen_ai.system_instructions`. Every attribute is cut to `otlp_content_max_bytes`, with a
marker saying how long it was, so one huge prompt cannot make a span a collector refuses.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

Json = dict[str, Any]


def content_attributes(request: Json, response: Json, max_bytes: int) -> Iterator[tuple[str, str]]:
    """The content attributes of one exchange, each at most `max_bytes` plus its marker."""
    responses_api = "input" in request and "messages" not in request
    if responses_api:
        inputs: Any = _items_as_messages(request.get("input"), "user")
        if isinstance(request.get("instructions"), str):
            parts = [{"type": "text", "content": request["instructions"]}]
            yield "gen_ai.system_instructions", _bounded(parts, max_bytes)
    else:
        inputs = request.get("messages")
    if inputs is not None:
        yield "gen_ai.input.messages", _bounded(inputs, max_bytes)
    output = _output_messages(response)
    if output is not None:
        yield "gen_ai.output.messages", _bounded(output, max_bytes)


def _output_messages(response: Json) -> list[Json] | None:
    choices = response.get("choices")
    if isinstance(choices, list):
        out = []
        for position, choice in enumerate(c for c in choices if isinstance(c, dict)):
            message = choice.get("message")
            if not isinstance(message, dict):  # a legacy completion's text
                message = {"role": "assistant", "content": choice.get("text")}
            index = choice.get("index", position)
            out.append({**message, "index": index, "finish_reason": choice.get("finish_reason")})
        return out
    if "output" not in response:
        return None
    messages = _items_as_messages(response.get("output"), "assistant")
    reason = _responses_finish_reason(response)
    return [{**message, "finish_reason": reason} for message in messages]


def _responses_finish_reason(response: Json) -> str | None:
    """`stop` for a completed response; else why it stopped (`max_output_tokens`, ...)."""
    details = response.get("incomplete_details")
    if isinstance(details, dict) and isinstance(details.get("reason"), str):
        return str(details["reason"])
    status = response.get("status")
    return "stop" if status == "completed" else status if isinstance(status, str) else None


def _items_as_messages(items: Any, role: str) -> list[Json]:
    """Responses API items (or a string input) as messages of the chat shape."""
    if isinstance(items, str):
        return [{"role": role, "content": items}]
    if not isinstance(items, list):
        return []
    return [_item_as_message(item, role) for item in items if isinstance(item, dict)]


def _item_as_message(item: Json, role: str) -> Json:
    kind = item.get("type", "message")
    if kind == "message":
        return {"role": item.get("role", role), "content": _text(item.get("content"))}
    if kind == "function_call":
        call = {"name": item.get("name"), "arguments": item.get("arguments")}
        tool_call = {"id": item.get("call_id"), "type": "function", "function": call}
        return {"role": "assistant", "tool_calls": [tool_call]}
    if kind == "function_call_output":
        return {"role": "tool", "tool_call_id": item.get("call_id"), "content": item.get("output")}
    return {"role": item.get("role", role), "type": kind}  # reasoning, a built-in tool's call


def _text(content: Any) -> Any:
    """A message item's content: its text parts joined, or the parts as they are when some
    are not text (an image, a file)."""
    if not isinstance(content, list):
        return content
    texts = [p.get("text") for p in content if isinstance(p, dict)]
    strings = [t for t in texts if isinstance(t, str)]
    if texts and len(strings) == len(content):
        return "".join(strings)
    return content


def _bounded(value: Any, max_bytes: int) -> str:
    """`value` as JSON, cut to `max_bytes` (at a character's start) with a marker."""
    try:
        encoded = orjson.dumps(value)
    except TypeError:
        encoded = str(value).encode()
    if len(encoded) <= max_bytes:
        return encoded.decode()
    cut = encoded[:max_bytes].decode(errors="ignore")
    return f"{cut}…[flightrec: cut to {max_bytes} of {len(encoded)} bytes]"
