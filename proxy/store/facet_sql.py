"""Facet rows summed by the database from the exchanges themselves, for what the writer's sums
(`facets`) cannot answer: the ragged minutes at the ends of a range, the top lists of a
filtered view, and filters the sums do not have.

The sums are the cost report's own SQL (`cost.cost_nano`, `cost.is_unpriced`), so they agree
with `flightrec cost` to the last digit; the latency histograms count the same buckets as
`facets.add` (`bounds[i-1] <= ms < bounds[i]`). Rows come back shaped like `facets` rows
(`dim`, `span`, `start`, `value`, `hint` and the sums), one per hour for `all`, one per group
for the top dimensions, so the overview reads both kinds alike.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from proxy.store import tables as t
from proxy.store.cost import cost_nano, is_unpriced
from proxy.store.rollups import bucket_start

Facet = dict[str, Any]
TOKENS = ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens")


@cache
def _histograms() -> tuple[sa.Label[Any], ...]:
    """Both histograms' sums, built once: the expressions are immutable and reusable."""
    ex = t.exchanges
    return (*_histogram(ex.c.duration_ms, "d"), *_histogram(ex.c.ttft_ms, "t"))


def _histogram(column: Any, prefix: str) -> list[sa.Label[Any]]:
    bounds = t.LATENCY_BOUNDS_MS
    out = []
    for i in range(t.HISTOGRAM):
        inside = [column.is_not(None)]
        if i:
            inside.append(column >= bounds[i - 1])
        if i < len(bounds):
            inside.append(column < bounds[i])
        out.append(sa.func.sum(sa.case((sa.and_(*inside), 1), else_=0)).label(f"{prefix}{i}"))
    return out


def _counts() -> list[sa.Label[Any]]:
    """requests, errors, cost_nano, priced, unpriced: what both queries sum."""
    ex = t.exchanges
    return [
        sa.func.count().label("requests"),
        sa.func.sum(sa.case((ex.c.outcome != "ok", 1), else_=0)).label("errors"),
        sa.func.sum(cost_nano()).label("cost_nano"),
        sa.func.count(ex.c.cost_usd).label("priced"),
        sa.func.sum(sa.case((is_unpriced(), 1), else_=0)).label("unpriced"),
    ]


def _source() -> Any:
    ex, usage = t.exchanges, t.usage
    return ex.outerjoin(usage, usage.c.exchange_id == ex.c.id)


def hours_query(where: list[sa.ColumnElement[bool]], dialect: str) -> sa.Select[Any]:
    """The `all` facet of each hour, with every sum and both histograms."""
    ex, usage = t.exchanges, t.usage
    when = bucket_start(ex.c.started_at, "hour", dialect)
    return (
        sa.select(
            when.label("start"),
            *_counts(),
            *(sa.func.sum(usage.c[name]).label(name) for name in TOKENS),
            *_histograms(),
        )
        .select_from(_source())
        .where(*where)
        .group_by(when)
    )


def edge_query(where: list[sa.ColumnElement[bool]]) -> sa.Select[Any]:
    """The top lists' counts per model, key and user at once: for a short span (an hour at
    most), where one pass over its exchanges beats one per top dimension. Its groups are
    nearly as many as the exchanges, so it sums only what the top lists show."""
    ex = t.exchanges
    model = sa.func.coalesce(ex.c.response_model, ex.c.model)
    return (
        sa.select(
            model.label("model"),
            ex.c.key_hash.label("key"),
            sa.func.max(ex.c.key_hint).label("hint"),
            ex.c.end_user.label("user"),
            *_counts(),
        )
        .select_from(_source())
        .where(*where)
        .group_by(model, ex.c.key_hash, ex.c.end_user)
    )


def top_query(dim: str, where: list[sa.ColumnElement[bool]]) -> sa.Select[Any]:
    """The groups of `dim` (`model`, `key`, `user`, `tag`) with their counts."""
    ex = t.exchanges
    source = _source()
    hint: Any = sa.null()
    if dim == "tag":
        tag = t.tags.alias("top_tag")
        source = source.join(tag, tag.c.exchange_id == ex.c.id)
        group: Any = tag.c.key + "=" + tag.c.value
    elif dim == "model":
        group = sa.func.coalesce(ex.c.response_model, ex.c.model)
    elif dim == "key":
        group, hint = ex.c.key_hash, sa.func.max(ex.c.key_hint)
    else:
        group = ex.c.end_user
    return (
        sa.select(group.label("value"), hint.label("hint"), *_counts())
        .select_from(source)
        .where(*where, group.is_not(None))
        .group_by(group)
    )


def _start(value: Any) -> datetime:
    """An hour as `bucket_start` gives it: a timestamp, or SQLite's 'YYYY-MM-DD HH'."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    day, _, hour = str(value).partition(" ")
    return datetime.fromisoformat(f"{day}T{hour or '00'}:00:00+00:00")


async def summed(
    conn: AsyncConnection,
    where: list[sa.ColumnElement[bool]],
    dims: tuple[str, ...],
    *,
    hours: bool = True,
) -> list[Facet]:
    """Facet rows of the exchanges matching `where`: `all` per hour (unless not `hours`), and
    each of `dims` summed over them all (their `start` is None)."""
    dialect = conn.dialect.name
    out: list[Facet] = []
    found = (await conn.execute(hours_query(where, dialect))).mappings() if hours else []
    for row in found:
        found = {name: int(value or 0) for name, value in row.items() if name != "start"}
        start = _start(row["start"])
        out.append({"dim": "all", "span": "hour", "start": start, "value": "", "hint": None,
                    **found})  # fmt: skip
    for dim in dims:
        for row in (await conn.execute(top_query(dim, where))).mappings():
            sums = {name: int(row[name] or 0) for name in t.FACET_TOP[2:]}
            out.append({"dim": dim, "span": "hour", "start": None, "value": row["value"],
                        "hint": row["hint"], **sums})  # fmt: skip
    return out


async def summed_short(
    conn: AsyncConnection, where: list[sa.ColumnElement[bool]], dims: tuple[str, ...]
) -> list[Facet]:
    """`summed` for a span of an hour or less: one pass for `all`, one for models, keys and
    users, one for tags."""
    tops: dict[tuple[str, Any], Facet] = {}
    crossed = {"model", "key", "user"}.intersection(dims)
    for row in (await conn.execute(edge_query(where))).all() if crossed else ():
        sums = row[4:]
        for dim, at in (("model", 0), ("key", 1), ("user", 3)):
            value = row[at]
            if dim not in dims or value is None:
                continue
            top = tops.get((dim, value))
            if top is None:
                top = tops[(dim, value)] = {"dim": dim, "span": "hour", "start": None,
                                            "value": value, "hint": None,
                                            **dict.fromkeys(t.FACET_TOP[2:], 0)}  # fmt: skip
            for name, amount in zip(t.FACET_TOP[2:], sums, strict=True):
                top[name] += int(amount or 0)
            if dim == "key" and top["hint"] is None:
                top["hint"] = row[2]
    alls = await summed(conn, where, tuple(dim for dim in dims if dim == "tag"))
    return [*alls, *tops.values()]
