"""`flightrec cost --reprice [--dry-run]`: stored costs recomputed with today's prices.

Each stored exchange is priced again as it was when it completed (`proxy.sinks.settle`): its
stored usage decoded by the one decoder, its model name (the answering model, else the
requested one), upstream and URL, the service tier its response reported, its start time.
Exchanges are walked by id (keyset), one transaction per batch, so a proxy can go on writing
between batches; only rows whose cost or price entry changed are written, and none with
`dry_run`. Rollups keep the cost their exchanges had when pruned.

What it says, per model and in total: the exchanges looked at, how many change, and the
totals before and after, each cost rounded to whole nano-dollars first as the report does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.pricing import Prices
from proxy.store import tables as t
from proxy.store.cost import NANO
from proxy.store.filters import Filters
from proxy.text import printable
from proxy.usage import decode_usage


@dataclass(slots=True)
class Change:
    """One model's exchanges, before and after."""

    seen: int = 0
    changed: int = 0
    old_nano: int = 0
    new_nano: int = 0
    old_unpriced: int = 0
    """Exchanges with usage and no cost, before."""
    new_unpriced: int = 0

    def add(self, old: float | None, new: float | None, usage: bool, changed: bool) -> None:
        self.seen += 1
        self.changed += changed
        self.old_nano += _nano(old)
        self.new_nano += _nano(new)
        self.old_unpriced += usage and old is None
        self.new_unpriced += usage and new is None


@dataclass(slots=True)
class Repriced:
    models: dict[str, Change] = field(default_factory=dict)
    """By model name ("" for none)."""
    written: bool = False

    def total(self) -> Change:
        out = Change()
        for change in self.models.values():
            for name in Change.__slots__:
                setattr(out, name, getattr(out, name) + getattr(change, name))
        return out


def _nano(cost: float | None) -> int:
    return 0 if cost is None else round(cost * 1e9)


async def reprice(
    engine: AsyncEngine,
    prices: Prices,
    filters: Filters | None = None,
    *,
    dry_run: bool = False,
    batch_size: int = 5000,
) -> Repriced:
    """Price the stored exchanges (matching `filters`) again; write the changes unless
    `dry_run`."""
    ex, usage, booked = t.exchanges, t.usage, t.batch_results
    query = (
        sa.select(
            ex.c.id,
            sa.func.coalesce(ex.c.response_model, ex.c.model).label("name"),
            ex.c.upstream,
            ex.c.upstream_url,
            ex.c.service_tier,
            ex.c.started_at,
            ex.c.cost_usd,
            ex.c.price_entry,
            usage.c.raw,
            booked.c.line_id.is_not(None).label("batch"),  # a batch result keeps batch rates
        )
        .select_from(
            ex.outerjoin(usage, usage.c.exchange_id == ex.c.id).outerjoin(
                booked, booked.c.exchange_id == ex.c.id
            )
        )
        .where(*(filters or Filters()).where())
        .order_by(ex.c.id)
        .limit(batch_size)
    )
    update = (
        sa.update(ex)
        .where(ex.c.id == sa.bindparam("b_id"))
        .values(cost_usd=sa.bindparam("b_cost"), price_entry=sa.bindparam("b_entry"))
    )
    done = Repriced(written=not dry_run)
    last: str | None = None
    while True:
        async with engine.begin() as conn:
            page = query if last is None else query.where(ex.c.id > last)
            found = (await conn.execute(page)).all()
            if not found:
                return done
            last = found[-1].id
            changes = _changes(prices, found, done)
            if changes and not dry_run:
                await conn.execute(update, changes)


def _changes(prices: Prices, found: Iterable[Any], done: Repriced) -> list[dict[str, Any]]:
    changes = []
    for row in found:
        priced = prices.price(
            decode_usage(row.raw),
            row.name,
            upstream=row.upstream,
            base_url=row.upstream_url,
            service_tier=row.service_tier,
            started_at=row.started_at.timestamp(),
            batch=bool(row.batch),
        )
        cost, entry = (None, None) if priced is None else priced
        changed = (cost, entry) != (row.cost_usd, row.price_entry)
        change = done.models.setdefault(row.name or "", Change())
        change.add(row.cost_usd, cost, row.raw is not None, changed)
        if changed:
            changes.append({"b_id": row.id, "b_cost": cost, "b_entry": entry})
    return changes


def _usd(nano: int) -> str:
    return f"{Decimal(nano) * NANO:.9f}".rstrip("0").rstrip(".") or "0"


def summary(done: Repriced) -> str:
    """What `--reprice` says: per model (dearest after first), then the total."""
    verb = "changed" if done.written else "would change (dry run: nothing written)"
    header = ["MODEL", "EXCHANGES", "CHANGED", "OLD USD", "NEW USD", "UNPRICED", "AFTER"]
    order = sorted(done.models.items(), key=lambda item: (-item[1].new_nano, item[0]))
    lines = [header]
    for name, change in [*order, ("TOTAL", done.total())]:
        lines.append(
            [
                printable(name or "(none)", cell=True),
                str(change.seen),
                str(change.changed),
                _usd(change.old_nano),
                _usd(change.new_nano),
                str(change.old_unpriced),
                str(change.new_unpriced),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    ]
    total = done.total()
    head = f"repriced {total.seen} exchanges: {total.changed} {verb}"
    return "\n".join([head, *text])
