"""The list's other orders (`sort=`): by cost, duration or time to first token, largest
first, or oldest first; paged by a cursor on (value, id) like the default order, so a page
deep in the list costs what the first does once the database has sorted the selection.

Without an index on those columns the database sorts the whole selection for each page: a
filter that narrows it (time, model, user) keeps that cheap.
"""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from proxy.store import tables as t

SORTS = ("newest", "oldest", "cost", "duration", "ttft")
_BY = {"cost": "cost_usd", "duration": "duration_ms", "ttft": "ttft_ms"}


def parse_sort(text: str) -> str:
    if text not in SORTS:
        raise ValueError(f"expected one of {', '.join(SORTS)}, got {text!r}")
    return text


def _key(sort: str) -> sa.ColumnElement[Any]:
    # No value sorts last: below every real one.
    return sa.func.coalesce(t.exchanges.c[_BY[sort]], -1.0)


def ordered(query: sa.Select[Any], sort: str) -> sa.Select[Any]:
    ex = t.exchanges
    if sort == "oldest":
        return query.order_by(None).order_by(ex.c.started_at, ex.c.id)
    return query.order_by(None).order_by(_key(sort).desc(), ex.c.id.desc())


def encode(sort: str, row: dict[str, Any]) -> str:
    value = row["started_at"] if sort == "oldest" else row[_BY[sort]]
    text = f"{sort}|{-1.0 if value is None else value}|{row['id']}"
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode(cursor: str) -> tuple[str, datetime | float, str]:
    """(sort, value, id) of a cursor `encode` made; ValueError for anything else."""
    try:
        text = base64.urlsafe_b64decode((cursor + "=" * (-len(cursor) % 4)).encode()).decode()
        named, value, last = text.split("|", 2)
        if named == "oldest":
            at = datetime.fromisoformat(value)
            return named, at.replace(tzinfo=at.tzinfo or UTC), last
        if named in _BY:
            return named, float(value), last
    except (ValueError, UnicodeError, binascii.Error):
        pass
    raise ValueError("not a cursor this server gave out")


def after(query: sa.Select[Any], sort: str, cursor: str) -> sa.Select[Any]:
    """The rows after the cursor's in `sort` order; ValueError for a cursor not of it."""
    named, value, last = decode(cursor)
    if named != sort:
        raise ValueError(f"a cursor of sort={named}, not sort={sort}")
    ex = t.exchanges
    if isinstance(value, datetime):
        newer = sa.or_(ex.c.started_at > value, ex.c.id > last)
        return query.where(ex.c.started_at >= value, newer)
    key = _key(sort)
    return query.where(key <= value, sa.or_(key < value, ex.c.id < last))
