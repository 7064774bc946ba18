"""The `logprobs` table's rows, built straight as the drivers' tuples.

A response with logprobs has a row per token, hundreds an exchange, against one or two rows in
every other table: so these rows skip the dict the other tables' rows are built as (and the
lookup that turns a dict into a tuple), and the common shapes (a string token, a float
logprob, lists) are checked by exact type before the general rules of `store.rows` apply.
Each tuple is in `tables.logprobs`' column order: exchange_id, choice_index, kind, position,
token, logprob, bytes, top_logprobs.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.text import dumps

Record = tuple[Any, ...]
"""One row as the drivers take it: the table's columns in declared order."""


def logprob_records(exchange_id: str, index: int, kind: str, tokens: list[Any]) -> list[Record]:
    """The rows of one choice's `content` or `refusal` logprobs (`kind`), one per token."""
    found: list[Record] = []
    append = found.append
    for position, raw in enumerate(tokens):
        token = raw if isinstance(raw, dict) else {}
        text = token.get("token")
        if type(text) is not str:
            text = text if isinstance(text, str) else ""
        if "\x00" in text:  # PostgreSQL text cannot hold NUL; the JSON copy keeps it
            text = text.replace("\x00", "\ufffd")
        logprob = token.get("logprob")
        if type(logprob) is not float:
            logprob = _float(logprob)
        units, top = token.get("bytes"), token.get("top_logprobs")
        if units.__class__ is list and top.__class__ is list:
            try:  # `_list_json` of each, written out for two plain lists
                units, top = orjson.dumps(units).decode(), orjson.dumps(top).decode()
            except TypeError:  # what orjson refuses: `_list_json`'s fallback, for each
                units, top = _list_json(units), _list_json(top)
        else:
            units, top = _list_json(units), _list_json(top)
        append((exchange_id, index, kind, position, text, logprob, units, top))
    return found


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _list_json(value: Any) -> str | None:
    """A list's JSON text; anything else is NULL."""
    if type(value) is not list and not isinstance(value, list):
        return None
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # what orjson refuses (non-string keys, ints beyond 64 bits)
        return dumps(value)
