"""Spend over time: the console's cost chart and `GET /api/cost/series`.

The same GROUP BY as `report.cost_report` (same groups, same filters, costs summed as whole
nano-dollars), with a time bucket (UTC hour or day) added to the grouping, so the points of a
series add up to the report's rows exactly.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from . import tables as t
from .filters import Filters
from .report import NANO, _group_column, cost_nano, is_unpriced, parse_by

BUCKETS = ("hour", "day")


def parse_bucket(text: str) -> str:
    if text not in BUCKETS:
        raise ValueError(f"expected hour or day, got {text!r}")
    return text


def _bucket_column(bucket: str, dialect: str) -> sa.ColumnElement[Any]:
    """The bucket's start in UTC: a timestamp (PostgreSQL), or the text 'YYYY-MM-DD HH' or
    'YYYY-MM-DD' (SQLite)."""
    ex = t.exchanges
    if dialect == "postgresql":
        return sa.func.date_trunc(bucket, sa.func.timezone("UTC", ex.c.started_at))
    # SQLite stores UTC times as 'YYYY-MM-DD HH:MM:SS...' text.
    return sa.func.substr(ex.c.started_at, 1, 13 if bucket == "hour" else 10)


def _start(value: Any) -> str:
    """'2024-05-01 13' (or a naive UTC datetime) -> '2024-05-01T13:00:00+00:00'; a day
    starts at midnight UTC."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC).isoformat()
    day, _, hour = str(value).partition(" ")
    return f"{day}T{hour or '00'}:00:00+00:00"


async def cost_series(
    engine: AsyncEngine, by: str = "model", bucket: str = "day", filters: Filters | None = None
) -> dict[str, Any]:
    """`{"bucket", "series": [{"group", "points": [[start, cost_usd, requests,
    prompt_tokens, completion_tokens], ...]}]}`, groups dearest first, points oldest first.
    A point's cost is None when all its requests are unpriced (unknown, not free)."""
    by, bucket = parse_by(by), parse_bucket(bucket)
    ex, usage = t.exchanges, t.usage
    dialect = engine.dialect.name
    group, source = _group_column(by, dialect)
    when = _bucket_column(bucket, dialect)
    nano, unpriced = cost_nano(), is_unpriced()
    query = (
        sa.select(
            group.label("group"),
            when.label("bucket"),
            sa.func.count().label("requests"),
            sa.func.sum(usage.c.prompt_tokens).label("prompt_tokens"),
            sa.func.sum(usage.c.completion_tokens).label("completion_tokens"),
            sa.func.sum(nano).label("cost_nano"),
            sa.func.count(ex.c.cost_usd).label("priced"),
            sa.func.sum(sa.case((unpriced, 1), else_=0)).label("unpriced"),
        )
        .select_from(source)
        .where(*(filters or Filters()).where())
        .group_by(group, when)
    )
    async with engine.connect() as conn:
        found = (await conn.execute(query)).all()
    groups: dict[Any, list[list[Any]]] = {}
    spent: dict[Any, int] = {}
    for row in sorted(found, key=lambda r: str(r.bucket)):  # both kinds sort as text
        unknown = row.priced == 0 and int(row.unpriced or 0) > 0
        cost = None if unknown else float(int(row.cost_nano or 0) * NANO)
        groups.setdefault(row.group, []).append(
            [
                _start(row.bucket),
                cost,
                int(row.requests),
                int(row.prompt_tokens or 0),
                int(row.completion_tokens or 0),
            ]
        )
        spent[row.group] = spent.get(row.group, 0) + int(row.cost_nano or 0)
    order = sorted(groups, key=lambda g: (-spent[g], str(g)))
    return {"bucket": bucket, "series": [{"group": g, "points": groups[g]} for g in order]}
