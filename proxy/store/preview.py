"""A line of each exchange's prompt and answer, for the console's list.

Read for one page of ids at a time; a body longer than `LARGEST` is not read for a preview
(it says so), so a page of 1 MB prompts costs what a page of short ones does.
"""

from __future__ import annotations

from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.store import tables as t

LARGEST = 64 * 1024
WIDTH = 120
"""Characters of each side shown."""


def _line(text: Any) -> str:
    if isinstance(text, list):  # content parts
        text = " ".join(p.get("text", "") for p in text if isinstance(p, dict)) or "[parts]"
    return " ".join(str(text).split())[:WIDTH] if text is not None else ""


def prompt_of(request: Any) -> str:
    """The last user message (chat), `input` (Responses, embeddings), `prompt` (completions)."""
    if not isinstance(request, dict):
        return ""
    messages = request.get("messages")
    if isinstance(messages, list):
        users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        found = users[-1] if users else (messages[-1] if messages else {})
        return _line(found.get("content") if isinstance(found, dict) else found)
    found = request.get("input", request.get("prompt"))
    if isinstance(found, list) and found and isinstance(found[-1], dict):
        return _line(found[-1].get("content"))
    if isinstance(found, list):
        return f"[{len(found)} inputs]" if len(found) != 1 else _line(found[0])
    return _line(found)


def answer_of(response: Any) -> str:
    """The first choice's text, a Responses output's text, or what an endpoint returns."""
    if not isinstance(response, dict):
        return ""
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        first = choices[0]
        message = first.get("message")
        if isinstance(message, dict):
            calls = message.get("tool_calls")
            if not message.get("content") and isinstance(calls, list) and calls:
                names = [str((c.get("function") or {}).get("name")) for c in calls]
                return "calls " + ", ".join(names)
            return _line(message.get("content") or message.get("refusal"))
        return _line(first.get("text"))
    for item in response.get("output") or []:
        if isinstance(item, dict) and item.get("type") == "message":
            parts = [p.get("text") for p in item.get("content") or [] if isinstance(p, dict)]
            return _line(" ".join(str(p) for p in parts if p))
    data = response.get("data")
    if isinstance(data, list) and response.get("object") == "list":
        return (
            f"{len(data)} embeddings" if data and "embedding" in data[0] else f"{len(data)} items"
        )
    return _line(response.get("text", ""))


def _short(column: Any) -> sa.ColumnElement[Any]:
    text = sa.cast(column, sa.Text)
    return sa.case((sa.func.length(text) <= LARGEST, text), else_=sa.null())


async def previews(engine: AsyncEngine, ids: list[str]) -> dict[str, tuple[str, str]]:
    """(prompt, answer) lines of each exchange in `ids`."""
    if not ids:
        return {}
    ex = t.exchanges
    query = sa.select(
        ex.c.id, _short(ex.c.request), _short(ex.c.response), ex.c.request_omitted
    ).where(ex.c.id.in_(ids))
    out = {}
    async with engine.connect() as conn:
        for exchange_id, request, response, omitted in await conn.execute(query):
            asked = (
                prompt_of(_loads(request)) if request else ("(not stored)" if omitted else "(long)")
            )
            out[exchange_id] = (asked, answer_of(_loads(response)) if response else "")
    return out


def _loads(text: Any) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
