"""Browsing the record: the filtered, keyset-paginated list behind `logs`, the console's log
list and `GET /api/exchanges`, plus the small reads the console's exchange page needs.

One query serves every caller, so `logs --json` and the API print the same objects. Pages
are cut by a cursor on (started_at, id), never by OFFSET: the millionth row costs what the
first does. The filters are `filters.Filters` (time range, model, key, tags: the same meaning
as in `flightrec cost`) plus the ones only a list needs.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, get_args

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.exchange import Outcome
from proxy.store import sorting
from proxy.store import tables as t
from proxy.store.filters import Filters
from proxy.store.read import _iso, _tags

OUTCOMES: tuple[str, ...] = get_args(Outcome)
MAX_LIMIT = 500


@dataclass(frozen=True, slots=True)
class ListFilters:
    """What the log list shows; every given filter must match."""

    base: Filters = field(default_factory=Filters)
    """since, until, model (requested or answering), key (hint or hash prefix), tags."""
    outcome: str | None = None
    """One outcome, or `error`: any outcome but `ok`."""
    status: int | None = None
    status_class: int | None = None
    """4 or 5: any 4xx or 5xx status."""
    user: str | None = None
    upstream: str | None = None
    fingerprint: str | None = None
    """The response's `system_fingerprint`, exactly."""
    replay_of: str | None = None
    """Only replays of this exchange."""
    session: str | None = None
    """The exchanges of one session: its `session` id, or the first exchange of a chain the
    writer linked, whose id the chain took (`threads.py`)."""
    q: str | None = None
    """Text searched (case-insensitively for ASCII) in stored requests and answers
    (`_text_search`)."""

    def where(self) -> list[sa.ColumnElement[bool]]:
        ex = t.exchanges
        found = self.base.where()
        outcome = None if self.outcome == "error" else self.outcome
        for column, value in (
            (ex.c.outcome, outcome),
            (ex.c.status, self.status),
            (ex.c.end_user, self.user),
            (ex.c.upstream, self.upstream),
            (ex.c.system_fingerprint, self.fingerprint),
            (ex.c.replay_of, self.replay_of),
        ):
            if value is not None:
                found.append(column == value)
        # The conditions of the partial failure indexes (migration 0003), stated as the
        # indexes state them: SQLite uses a partial index only when the query says so.
        if self.outcome is not None and self.outcome != "ok":
            found.append(ex.c.outcome != sa.literal_column("'ok'"))
        if self.status is not None and self.status >= 400:
            found.append(ex.c.status >= sa.literal_column("400"))
        if self.status_class is not None:
            low = self.status_class * 100
            found += [ex.c.status >= sa.literal_column("400"), ex.c.status.between(low, low + 99)]
        if self.session is not None:
            found.append(sa.or_(ex.c.session == self.session, ex.c.id == self.session))
        if self.q:
            found.append(_text_search(self.q))
        return found


def _text_search(text: str) -> sa.ColumnElement[bool]:
    """The words as typed, in the request JSON (prompts) or the answer: a chat completion's
    choice texts, or, for an exchange with no choice rows (Responses API, legacy completions,
    transcriptions, ...), its stored response JSON."""
    ex, choices = t.exchanges, t.choices
    needle = text.lower()

    def has(column: Any) -> sa.ColumnElement[bool]:
        return sa.func.lower(column).contains(needle, autoescape=True)

    of_this = choices.c.exchange_id == ex.c.id
    in_answer = sa.exists().where(of_this, sa.or_(has(choices.c.content), has(choices.c.refusal)))
    # Only without choice rows: a chat response's JSON would also match ids and field names.
    in_other_answer = sa.and_(~sa.exists().where(of_this), has(sa.cast(ex.c.response, sa.Text)))
    return sa.or_(has(sa.cast(ex.c.request, sa.Text)), in_answer, in_other_answer)


def encode_cursor(started_at: str, exchange_id: str) -> str:
    return base64.urlsafe_b64encode(f"{started_at}|{exchange_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The (started_at, id) a page ends at; ValueError for anything not made by us."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        text = base64.urlsafe_b64decode(padded.encode("ascii")).decode("utf-8")
        when, sep, exchange_id = text.partition("|")
        started = datetime.fromisoformat(when)
    except (ValueError, UnicodeError, binascii.Error):
        raise ValueError("not a cursor this server gave out") from None
    if not sep or not exchange_id or started.tzinfo is None:
        raise ValueError("not a cursor this server gave out")
    return started.astimezone(UTC), exchange_id


def _summary_query(filters: ListFilters) -> sa.Select[Any]:
    ex, usage = t.exchanges, t.usage
    return (
        sa.select(
            ex.c.id,
            ex.c.started_at,
            ex.c.method,
            ex.c.path,
            ex.c.upstream,
            ex.c.model,
            ex.c.response_model,
            ex.c.status,
            ex.c.outcome,
            ex.c.stream,
            ex.c.ttft_ms,
            ex.c.duration_ms,
            usage.c.prompt_tokens,
            usage.c.completion_tokens,
            usage.c.total_tokens,
            usage.c.cached_tokens,
            usage.c.reasoning_tokens,
            ex.c.cost_usd,
            ex.c.end_user.label("user"),
            ex.c.key_hint,
            ex.c.key_hash,
            ex.c.system_fingerprint,
            ex.c.replay_of,
            ex.c.session,
        )
        .select_from(ex.outerjoin(usage, usage.c.exchange_id == ex.c.id))
        .where(*filters.where())
        .order_by(ex.c.started_at.desc(), ex.c.id.desc())
    )


async def list_page(
    engine: AsyncEngine,
    filters: ListFilters | None = None,
    *,
    limit: int = 50,
    cursor: str | None = None,
    sort: str = "newest",
) -> tuple[list[dict[str, Any]], str | None]:
    """One page of `logs --json` objects, newest first (or in another `sorting` order), and
    the cursor of the next page (None on the last). `cursor` is the `next` of the previous
    page."""
    ex = t.exchanges
    query = _summary_query(filters or ListFilters()).limit(limit + 1)
    if sort != "newest":
        return await _sorted_page(engine, query, sort, limit, cursor)
    if cursor is not None:
        started, last_id = decode_cursor(cursor)
        # The first condition alone bounds the index range; the second drops the rows of
        # that same instant already shown.
        query = query.where(
            ex.c.started_at <= started,
            sa.or_(ex.c.started_at < started, ex.c.id < last_id),
        )
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
        rows, more = rows[:limit], len(rows) > limit
        tags_by_id = await _tags(conn, [row["id"] for row in rows])
    items = [
        {**row, "started_at": _iso(row["started_at"]), "tags": tags_by_id[row["id"]]}
        for row in rows
    ]
    following = encode_cursor(items[-1]["started_at"], items[-1]["id"]) if more else None
    return items, following


async def _sorted_page(
    engine: AsyncEngine, query: sa.Select[Any], sort: str, limit: int, cursor: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    query = sorting.ordered(query, sort)
    if cursor is not None:
        query = sorting.after(query, sort, cursor)
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
        rows, more = rows[:limit], len(rows) > limit
        tags_by_id = await _tags(conn, [row["id"] for row in rows])
    following = sorting.encode(sort, dict(rows[-1])) if more else None
    items = [
        {**row, "started_at": _iso(row["started_at"]), "tags": tags_by_id[row["id"]]}
        for row in rows
    ]
    return items, following


async def replays_of(engine: AsyncEngine, exchange_id: str) -> list[str]:
    """Ids of the exchanges that replay this one, oldest first."""
    ex = t.exchanges
    query = (
        sa.select(ex.c.id).where(ex.c.replay_of == exchange_id).order_by(ex.c.started_at, ex.c.id)
    )
    async with engine.connect() as conn:
        return list((await conn.execute(query)).scalars())


async def fingerprints(engine: AsyncEngine) -> list[dict[str, Any]]:
    """The `fingerprints` rows, by upstream and model, then as first seen."""
    fp = t.fingerprints
    query = sa.select(fp).order_by(fp.c.upstream, fp.c.model, fp.c.first_seen)
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [
        {
            "upstream": row["upstream"],
            "model": row["model"],
            "system_fingerprint": row["system_fingerprint"],
            "first_seen": _iso(row["first_seen"]),
            "last_seen": _iso(row["last_seen"]),
            "count": int(row["count"]),
        }
        for row in rows
    ]


async def list_exchanges(
    engine: AsyncEngine,
    *,
    limit: int = 50,
    model: str | None = None,
    since: datetime | None = None,
    tags: list[tuple[str, str]] | None = None,
) -> list[dict[str, Any]]:
    """`logs`: the first page of `list_page` (the console's list), newest first.
    `model` matches the requested or the answering model exactly, as in `cost`."""
    filters = ListFilters(Filters(since=since, model=model, tags=tuple(tags or ())))
    items, _next = await list_page(engine, filters, limit=limit)
    return items
