"""Sessions without a header: which earlier exchange an exchange continues (SPEC section 8).

Two keys per exchange, computed by the writer when it stores the exchange (never on the
request path): `turn_key`, what a next turn would name, and `parent_key`, what this one names.

- Chat Completions: a chat whose messages are an earlier exchange's messages plus its answer
  (and then the new user or tool messages) continues it. `turn_key` hashes the request's
  messages and the first choice's answer; `parent_key` hashes the request's messages up to and
  including its last assistant message. Messages are compared by what a client sends back
  (role, text, tool calls, tool call id, name), so an answer echoed without `refusal: null` or
  `annotations` still matches. The cost is one pass over the messages for both keys.
- Responses API: `turn_key` is the response's id, `parent_key` the request's
  `previous_response_id`.

The writer (`link`) gives an exchange with a parent the parent's session, or the parent's id
when the parent has none: a chain's session id is its first exchange's id. An exchange with
its own session (the `X-Flightrec-Session` header, a WebSocket connection) keeps it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from proxy.store.tables import EXCHANGE_AT


def _text(value: Any) -> Any:
    """A message's content as sent back: a string, or a list of parts as given."""
    if isinstance(value, list) and all(
        isinstance(p, dict) and p.get("type") == "text" for p in value
    ):
        return "".join(str(p.get("text", "")) for p in value)
    return value if value is not None else ""


def _calls(value: Any) -> list[Any]:
    if not isinstance(value, list):
        return []
    out = []
    for call in value:
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(fn, dict):
            out.append([call.get("id"), fn.get("name"), fn.get("arguments")])
    return out


def _message(value: Any) -> list[Any]:
    if not isinstance(value, dict):
        return [None]
    content, calls = value.get("content"), value.get("tool_calls")
    return [
        value.get("role"),
        content if content.__class__ is str else _text(content),  # a plain text: as it is
        [] if calls is None else _calls(calls),
        value.get("tool_call_id") or "",
        value.get("name") or "",
    ]


def _hashed(normalised: list[list[Any]]) -> str:
    """The key of messages as `_message` gives them: their JSON array, hashed."""
    return _key(hashlib.sha256(_dumped(normalised)))


def _dumped(normalised: list[list[Any]]) -> bytes:
    return orjson.dumps(normalised, option=orjson.OPT_NON_STR_KEYS)


def _key(digest: hashlib._Hash) -> str:
    return "chat:" + digest.hexdigest()[:32]


def keys(request: Any, response: Any) -> tuple[str | None, str | None]:
    """(turn_key, parent_key) of an exchange from its request and response JSON."""
    if not isinstance(request, dict):
        return None, None
    messages = request.get("messages")
    if isinstance(messages, list) and messages:
        return _chat_keys(messages, response)
    if "input" in request or "previous_response_id" in request:
        previous = request.get("previous_response_id")
        parent = f"resp:{previous}" if isinstance(previous, str) and previous else None
        own = response.get("id") if isinstance(response, dict) else None
        return (f"resp:{own}" if isinstance(own, str) and own else None), parent
    return None, None


def _chat_keys(messages: list[Any], response: Any) -> tuple[str | None, str | None]:
    # Each message is read, serialised and hashed once for both keys (an agent's request
    # carries its whole history, hundreds of KB): the parent's messages open the turn's, so
    # the turn's hash goes on from where the parent's array closes.
    normalised = [_message(m) for m in messages]
    choices = response.get("choices") if isinstance(response, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    answer = first.get("message") if isinstance(first, dict) else None
    said = _message(answer) if isinstance(answer, dict) else None
    last = _last_assistant(messages)
    if last is None:
        return (None if said is None else _hashed([*normalised, said])), None
    head = _dumped(normalised[: last + 1])  # `[...]`
    digest = hashlib.sha256(memoryview(head)[:-1])
    parent = digest.copy()
    parent.update(b"]")
    if said is None:
        return None, _key(parent)
    digest.update(b",")
    digest.update(memoryview(_dumped([*normalised[last + 1 :], said]))[1:])  # `...]`
    return _key(digest), _key(parent)


def _last_assistant(messages: list[Any]) -> int | None:
    """The index of the last assistant message; None when there is none."""
    for last in range(len(messages) - 1, -1, -1):
        message = messages[last]
        if isinstance(message, dict) and message.get("role") == "assistant":
            return last
    return None


def wanted(fresh: Iterable[Any]) -> list[str]:
    """The parent keys the batch's exchanges without a session look for."""
    return sorted(
        {
            rows.exchange[_PARENT_KEY]
            for rows in fresh
            if rows.exchange[_PARENT_KEY] and not rows.exchange[_SESSION]
        }
    )


def link(fresh: list[Any], stored: Mapping[str, tuple[str, str | None]]) -> None:
    """Give each exchange of the batch (oldest first) its parent's session; `stored` maps
    turn keys already in the database to (id, session) of their newest exchange."""
    known = dict(stored)
    for rows in sorted(fresh, key=lambda r: r.exchange[_STARTED_AT]):
        row = rows.exchange
        parent = row[_PARENT_KEY]
        if not row[_SESSION] and parent and parent in known:
            parent_id, parent_session = known[parent]
            session = parent_session or parent_id
            row = rows.exchange = (*row[:_SESSION], session, *row[_SESSION + 1 :])
        if row[_TURN_KEY]:
            known[row[_TURN_KEY]] = (row[_ID], row[_SESSION])


_ID, _STARTED_AT, _SESSION, _TURN_KEY, _PARENT_KEY = (
    EXCHANGE_AT[name] for name in ("id", "started_at", "session", "turn_key", "parent_key")
)
