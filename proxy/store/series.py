"""Spend over time: the console's cost chart and `GET /api/cost/series`.

The same GROUP BY as `report.cost_report` (same groups, same filters, costs summed as whole
nano-dollars, rollups of pruned exchanges beside kept ones), with a time bucket (UTC hour or
day) added to the grouping, so the points of a series add up to the report's rows exactly.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.store import rollups
from proxy.store import tables as t
from proxy.store.cost import NANO, cost_nano, group_column, is_unpriced, merge, parse_by
from proxy.store.filters import Filters

BUCKETS = ("hour", "day")


def parse_bucket(text: str) -> str:
    if text not in BUCKETS:
        raise ValueError(f"expected hour or day, got {text!r}")
    return text


def _start(value: Any) -> str:
    """'2024-05-01 13' (or a naive UTC datetime) -> '2024-05-01T13:00:00+00:00'; a day
    starts at midnight UTC."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC).isoformat()
    day, _, hour = str(value).partition(" ")
    return f"{day}T{hour or '00'}:00:00+00:00"


def _series_query(by: str, bucket: str, filters: Filters, dialect: str) -> Any:
    """Kept exchanges and rollups (a pruned day's at its midnight), in one statement."""
    ex, usage = t.exchanges, t.usage
    group, source = group_column(by, dialect)
    when = rollups.bucket_start(ex.c.started_at, bucket, dialect)
    kept = (
        sa.select(
            group.label("group"),
            when.label("bucket"),
            sa.func.count().label("requests"),
            sa.func.sum(usage.c.prompt_tokens).label("prompt_tokens"),
            sa.func.sum(usage.c.completion_tokens).label("completion_tokens"),
            sa.func.sum(cost_nano()).label("cost_nano"),
            sa.func.count(ex.c.cost_usd).label("priced"),
            sa.func.sum(sa.case((is_unpriced(), 1), else_=0)).label("unpriced_requests"),
        )
        .select_from(source)
        .where(*filters.where())
        .group_by(group, when)
    )
    rolled_group, rolled_source = rollups.group_column(by, dialect)
    rolled_when = rollups.bucket_start(t.rollups.c.day, bucket, dialect)
    names = ("requests", "prompt_tokens", "completion_tokens", "cost_nano", "priced", "unpriced")
    rolled = (
        sa.select(rolled_group.label("group"), rolled_when.label("bucket"), *rollups.sums(*names))
        .select_from(rolled_source)
        .where(*rollups.where(filters))
        .group_by(rolled_group, rolled_when)
    )
    return sa.union_all(kept, rolled)


async def cost_series(
    engine: AsyncEngine, by: str = "model", bucket: str = "day", filters: Filters | None = None
) -> dict[str, Any]:
    """`{"bucket", "series": [{"group", "points": [[start, cost_usd, requests,
    prompt_tokens, completion_tokens], ...]}]}`, groups dearest first, points oldest first.
    A point's cost is None when all its requests are unpriced (unknown, not free)."""
    by, bucket = parse_by(by), parse_bucket(bucket)
    query = _series_query(by, bucket, filters or Filters(), engine.dialect.name)
    async with engine.connect() as conn:
        found = merge((await conn.execute(query)).all(), ["group", "bucket"])
    groups: dict[Any, list[list[Any]]] = {}
    spent: dict[Any, int] = {}
    for row in sorted(found, key=lambda r: str(r["bucket"])):  # both kinds sort as text
        unknown = row["priced"] == 0 and row["unpriced_requests"] > 0
        cost = None if unknown else float(row["cost_nano"] * NANO)
        group = row["group"]
        groups.setdefault(group, []).append(
            [
                _start(row["bucket"]),
                cost,
                row["requests"],
                row["prompt_tokens"],
                row["completion_tokens"],
            ]
        )
        spent[group] = spent.get(group, 0) + row["cost_nano"]
    order = sorted(groups, key=lambda g: (-spent[g], str(g)))
    return {"bucket": bucket, "series": [{"group": g, "points": groups[g]} for g in order]}
