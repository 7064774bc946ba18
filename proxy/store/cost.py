"""The cost sums every report shares: `flightrec cost`, the rollups of pruned exchanges, and the
series behind the console's charts all group, sum and judge "unpriced" with these, so their
totals agree to the last nano-dollar (see `report.py` for what each column counts).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

import sqlalchemy as sa

from proxy.store import tables as t
from proxy.stream.endpoints import FREE_ENDPOINT

GROUPS = ("model", "key", "user", "day", "upstream")
"""`--by` values besides `tag:<key>`."""
NANO = Decimal("1e-9")


def day_text(column: Any, dialect: str) -> sa.ColumnElement[str]:
    """'YYYY-MM-DD' of a UTC time column (SQLite stores UTC times as text)."""
    if dialect == "postgresql":
        return sa.func.to_char(sa.func.timezone("UTC", column), "YYYY-MM-DD")
    return sa.func.substr(column, 1, 10)


def parse_by(text: str) -> str:
    """A `--by` value, checked: one of `GROUPS` or `tag:<key>` (key lower-cased)."""
    value = text.strip()
    if value.lower().startswith("tag:"):
        key = value[4:].strip().lower()
        if not key:
            raise ValueError("expected tag:<key>, e.g. tag:team")
        return f"tag:{key}"
    if value not in GROUPS:
        raise ValueError(f"expected one of {', '.join(GROUPS)} or tag:<key>, got {text!r}")
    return value


def group_column(by: str, dialect: str) -> tuple[sa.ColumnElement[Any], Any]:
    """The expression to group on, and the FROM clause it needs."""
    ex, usage = t.exchanges, t.usage
    source: Any = ex.outerjoin(usage, usage.c.exchange_id == ex.c.id)
    if by.startswith("tag:"):
        # (exchange_id, key) is the primary key of tags: at most one row joins per exchange,
        # so the groups still add up to the total.
        tag = t.tags.alias("grouped_tag")
        on = sa.and_(tag.c.exchange_id == ex.c.id, tag.c.key == by[4:])
        return tag.c.value, source.outerjoin(tag, on)
    if by == "model":
        # What answered is what was priced; the requested model when the response named none.
        return sa.func.coalesce(ex.c.response_model, ex.c.model), source
    plain = {"key": ex.c.key_hash, "user": ex.c.end_user, "upstream": ex.c.upstream}.get(by)
    if plain is not None:
        if dialect == "sqlite":
            # SQLite would walk the (column, started_at) index to get groups in order, one
            # random table read per exchange, where a scan and a sort read each page once
            # (docs/performance.md). The same value wrapped in an expression is not indexed.
            return sa.func.coalesce(plain, sa.null()), source
        return plain, source
    return day_text(ex.c.started_at, dialect), source


def cost_nano() -> sa.ColumnElement[int]:
    """An exchange's cost in whole nano-dollars, what reports sum."""
    return sa.cast(sa.func.round(t.exchanges.c.cost_usd * 1e9), sa.BigInteger)


def is_unpriced() -> sa.ColumnElement[bool]:
    """An exchange that should have a cost and has none (see the module docstring)."""
    ex, usage = t.exchanges, t.usage
    paid = sa.and_(
        ex.c.model.is_not(None), ex.c.status < 400, sa.not_(ex.c.path.endswith(FREE_ENDPOINT))
    )
    return sa.and_(
        ex.c.cost_usd.is_(None),
        sa.or_(usage.c.exchange_id.is_not(None), ex.c.usage_source == "missing", paid),
    )


def merge(found: Iterable[Any], keys: Sequence[str]) -> list[dict[str, Any]]:
    """Rows of the two sides of a union that share `keys` summed into one (`key_hint`: the
    largest, as SQL's max)."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in found:
        values = row._asdict()
        into = merged.setdefault(tuple(values[k] for k in keys), dict.fromkeys(values, 0))
        for name, value in values.items():
            if name in keys:
                into[name] = value
            elif name == "key_hint":
                into[name] = max(filter(None, (into[name], value)), default=None)
            else:
                into[name] += int(value or 0)
    return list(merged.values())
