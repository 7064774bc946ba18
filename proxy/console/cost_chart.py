"""The cost page's charts on a real time axis: from the filter's `since` (else the first
spend) to its `until` (else now), every bucket drawn, stacked by group (the seven dearest and
the rest together), and the days that pruning folded into daily rollups marked as such, so
their midnight bar reads as a day's total, not a spike."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.console import axes
from proxy.store import overview
from proxy.store import tables as t
from proxy.store.filters import Filters

COLOURS = 8
MOST_BUCKETS = 2400
"""A longer range shows its latest buckets: an hourly chart of a year would be unreadable."""


async def pruned_days(engine: AsyncEngine, since: datetime, until: datetime) -> list[datetime]:
    r = t.rollups
    query = sa.select(r.c.day).where(r.c.day >= since, r.c.day < until).distinct()
    async with engine.connect() as conn:
        found = (await conn.execute(query)).scalars().all()
    return sorted(d.replace(tzinfo=UTC) if d.tzinfo is None else d for d in found)


def _label(group: Any) -> str:
    return "(none)" if group is None else str(group)


def _series(found: dict[str, Any], starts: list[datetime], metric: str) -> list[Any]:
    at = {start: i for i, start in enumerate(starts)}
    out: list[tuple[str, str, list[float | None]]] = []
    for n, entry in enumerate(found["series"]):
        if n >= COLOURS - 1 and out and out[-1][0].endswith("others"):
            values = out[-1][2]
        else:
            name = _label(entry["group"]) if n < COLOURS - 1 else "others"
            values = [0.0] * len(starts)
            out.append((name, f"c{min(n, COLOURS - 1)}", values))
        for start, cost, _requests, prompt, completion in entry["points"]:
            i = at.get(datetime.fromisoformat(start))
            if i is None:
                continue
            if metric == "cost" and cost is None:  # every request of it unpriced: unknown
                values[i] = None if not values[i] else values[i]
            else:
                value = float(prompt + completion) if metric == "tokens" else cost
                values[i] = (values[i] or 0.0) + (value or 0.0)
    if len(out) == COLOURS:
        out[-1] = (f"{len(found['series']) - COLOURS + 1} others", *out[-1][1:])
    return out


async def charts(
    engine: AsyncEngine, found: dict[str, Any], filters: Filters, bucket: str
) -> dict[str, dict[str, Any] | None]:
    firsts = [datetime.fromisoformat(s["points"][0][0]) for s in found["series"] if s["points"]]
    until = filters.until or datetime.now(UTC)
    since = filters.since or min(firsts, default=until - timedelta(days=7))
    starts = overview.buckets(since, until, bucket)[-MOST_BUCKETS:]
    if not starts:
        return {"cost": None, "tokens": None}
    marks = await pruned_days(engine, starts[0], until)
    if bucket == "hour":  # a pruned day's rollup stands at its midnight hour
        marks = [day for day in marks if day in set(starts)]
    return {
        "cost": axes.chart(
            starts,
            bucket,
            _series(found, starts, "cost"),
            axes.usd,
            marks=marks,
            missing="unpriced",
            quiet_zeros=True,
        ),
        "tokens": axes.chart(
            starts,
            bucket,
            _series(found, starts, "tokens"),
            axes.count,
            marks=marks,
            quiet_zeros=True,
        ),
    }
