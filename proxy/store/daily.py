"""The record's usage and cost per UTC day and model, for `flightrec reconcile` to set beside
the provider's own figures.

One statement: kept exchanges of one upstream (`exchanges` joined with `usage`) and the daily
rollups of pruned ones (`rollups.py`), grouped by day and model (the answering model, else the
requested one: the name the provider's usage report groups by). `requests` counts the
exchanges the provider could have billed: those with recorded usage (a pruned day counts the
requests its rollups kept).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.store import tables as t
from proxy.store.cost import NANO, cost_nano, day_text, is_unpriced

FIELDS = ("requests", "input_tokens", "cached_tokens", "output_tokens", "cost_nano", "unpriced")


def _kept(upstream: str, since: datetime, until: datetime, dialect: str) -> sa.Select[Any]:
    ex, usage = t.exchanges, t.usage
    day = day_text(ex.c.started_at, dialect)
    model = sa.func.coalesce(ex.c.response_model, ex.c.model)
    sums: list[Any] = [
        sa.func.count(usage.c.exchange_id).label("requests"),
        sa.func.sum(usage.c.prompt_tokens).label("input_tokens"),
        sa.func.sum(usage.c.cached_tokens).label("cached_tokens"),
        sa.func.sum(usage.c.completion_tokens).label("output_tokens"),
        sa.func.sum(cost_nano()).label("cost_nano"),
        sa.func.sum(sa.case((is_unpriced(), 1), else_=0)).label("unpriced"),
    ]
    return (
        sa.select(day.label("day"), model.label("model"), *sums)
        .select_from(ex.outerjoin(usage, usage.c.exchange_id == ex.c.id))
        .where(ex.c.upstream == upstream, ex.c.started_at >= since, ex.c.started_at < until)
        .group_by(day, model)
    )


def _rolled(upstream: str, since: datetime, until: datetime, dialect: str) -> sa.Select[Any]:
    r = t.rollups
    day = day_text(r.c.day, dialect)
    model = sa.func.coalesce(r.c.response_model, r.c.model)
    names = {"requests": "requests", "prompt_tokens": "input_tokens",
             "cached_tokens": "cached_tokens", "completion_tokens": "output_tokens",
             "cost_nano": "cost_nano", "unpriced": "unpriced"}  # fmt: skip
    sums: list[Any] = [sa.func.sum(r.c[name]).label(label) for name, label in names.items()]
    return (
        sa.select(day.label("day"), model.label("model"), *sums)
        .where(r.c.upstream == upstream, r.c.day >= since, r.c.day < until)
        .group_by(day, model)
    )


async def record_days(
    engine: AsyncEngine, upstream: str, since: datetime, until: datetime
) -> dict[tuple[str, str], dict[str, Any]]:
    """{(day, model): {requests, input_tokens, cached_tokens, output_tokens, cost_usd,
    unpriced}} for exchanges of `upstream` started in [since, until); `cost_usd` is None for
    a group with no priced exchange."""
    dialect = engine.dialect.name
    query = sa.union_all(
        _kept(upstream, since, until, dialect), _rolled(upstream, since, until, dialect)
    )
    async with engine.connect() as conn:
        found = (await conn.execute(query)).mappings().all()
    days: dict[tuple[str, str], dict[str, Any]] = {}
    for row in found:
        key = (str(row["day"]), row["model"] or "")
        into = days.setdefault(key, dict.fromkeys(FIELDS, 0) | {"priced": False})
        for name in FIELDS:
            into[name] += int(row[name] or 0)
        into["priced"] = into["priced"] or row["cost_nano"] is not None
    for totals in days.values():
        nano = totals.pop("cost_nano")
        priced = totals.pop("priced")
        totals["cost_usd"] = float(nano * NANO) if priced else None
    return days
