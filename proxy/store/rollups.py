"""Daily rollups: what the cost report still knows of pruned exchanges.

Before `prune` deletes exchanges, `fold` adds their usage and cost to `rollups` (one row per
UTC day and group: upstream, requested and answering model, key, user, tag set; its tags in
`rollup_tags`), in the same transaction as the delete. The cost report and series read
`rollups` beside `exchanges` in one statement (`select`), with the same groups and filters,
so every total is the same before, during and after pruning.

A rollup stands at its day's midnight (UTC): a `since`/`until` range counts a pruned day whole
when the range holds that midnight. Ranges on whole days (what `--by day` and the console's day
series show) are exact; a range that starts or ends inside a pruned day is not, and
`docs/retention.md` says so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from proxy.store import cost
from proxy.store import tables as t
from proxy.store.cost import cost_nano, is_unpriced
from proxy.store.filters import Filters

SUMS = (
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cost_nano",
    "priced",
    "unpriced",
)
GROUP = ("upstream", "model", "response_model", "key_hash", "key_hint", "end_user")
"""The exchange columns a rollup keeps, besides its day and tags."""


def bucket_start(column: Any, bucket: str, dialect: str) -> sa.ColumnElement[Any]:
    """The start of `column`'s UTC hour or day: a timestamp (PostgreSQL), or the text
    'YYYY-MM-DD HH' or 'YYYY-MM-DD' (SQLite)."""
    if dialect == "postgresql":
        return sa.func.date_trunc(bucket, sa.func.timezone("UTC", column))
    return sa.func.substr(column, 1, 13 if bucket == "hour" else 10)


def where(filters: Filters) -> list[sa.ColumnElement[bool]]:
    """`filters` applied to rollups: the filters of the cost report, no others."""
    if filters.also or filters.requested_model or filters.originals_only or filters.limit:
        raise ValueError("rollups answer only since, until, model, key and tag filters")
    r, rt = t.rollups, t.rollup_tags

    def tagged(key: str, value: str) -> sa.ColumnElement[bool]:
        return sa.exists().where(rt.c.rollup_id == r.c.id, rt.c.key == key, rt.c.value == value)

    return filters.report_where(r.c.day, r, tagged)


def group_column(by: str, dialect: str) -> tuple[sa.ColumnElement[Any], Any]:
    """The rollup expression matching the report's group `by`, and the FROM it needs."""
    r = t.rollups
    if by.startswith("tag:"):
        tag = t.rollup_tags.alias("grouped_rollup_tag")
        on = sa.and_(tag.c.rollup_id == r.c.id, tag.c.key == by[4:])
        return tag.c.value, r.outerjoin(tag, on)
    if by == "model":
        return sa.func.coalesce(r.c.response_model, r.c.model), r
    if by == "day":
        return cost.day_text(r.c.day, dialect), r
    column = {"key": r.c.key_hash, "user": r.c.end_user, "upstream": r.c.upstream}[by]
    return column, r


def sums(*names: str) -> list[sa.Label[Any]]:
    """`sum(rollups.<name>)` for each name, labelled as the report labels it."""
    labels = {"unpriced": "unpriced_requests"}
    return [sa.func.sum(t.rollups.c[name]).label(labels.get(name, name)) for name in names]


# --- folding exchanges into rollups (the write side, run by `prune`) ---


@dataclass(slots=True)
class Rollup:
    day: datetime
    group: tuple[Any, ...]
    tags: tuple[tuple[str, str], ...]
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SUMS, 0))

    @property
    def id(self) -> str:
        key = [self.day.date().isoformat(), *self.group, [list(pair) for pair in self.tags]]
        return hashlib.sha256(orjson.dumps(key)).hexdigest()[:32]


def fold_query(ids: Sequence[str]) -> sa.Select[Any]:
    """What `add` needs of each exchange in `ids`, evaluated by the database as the report
    evaluates it (cost in nano-dollars, priced, unpriced)."""
    ex, usage = t.exchanges, t.usage
    tokens = (usage.c[name] for name in SUMS[1:5])
    return (
        sa.select(
            ex.c.id,
            ex.c.started_at,
            *(ex.c[name] for name in GROUP),
            *tokens,
            cost_nano().label("cost_nano"),
            ex.c.cost_usd.is_not(None).label("priced"),
            sa.case((is_unpriced(), 1), else_=0).label("unpriced"),
        )
        .select_from(ex.outerjoin(usage, usage.c.exchange_id == ex.c.id))
        .where(ex.c.id.in_(ids))
    )


def add(found: Iterable[Any], tags: dict[str, list[tuple[str, str]]]) -> list[Rollup]:
    """Sum exchanges (rows of `fold_query`) per day and group."""
    rollups: dict[str, Rollup] = {}
    for row in found:
        at = row.started_at
        day = datetime(at.year, at.month, at.day, tzinfo=UTC)  # stored in UTC
        rollup = Rollup(
            day, tuple(getattr(row, name) for name in GROUP), tuple(sorted(tags[row.id]))
        )
        rollup = rollups.setdefault(rollup.id, rollup)
        totals = rollup.totals
        totals["requests"] += 1
        for name in SUMS[1:]:
            totals[name] += int(getattr(row, name) or 0)
    return list(rollups.values())


def save(conn: sa.Connection, rollups: list[Rollup]) -> None:
    """Add `rollups` to the stored ones (a new group gets a row and its tags)."""
    if not rollups:
        return
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    rows = [
        {"id": r.id, "day": r.day, **dict(zip(GROUP, r.group, strict=True)), **r.totals}
        for r in rollups
    ]
    statement = insert(t.rollups)
    added = {name: t.rollups.c[name] + statement.excluded[name] for name in SUMS}
    conn.execute(statement.on_conflict_do_update(index_elements=["id"], set_=added), rows)
    tag_rows = [{"rollup_id": r.id, "key": k, "value": v} for r in rollups for k, v in r.tags]
    if tag_rows:
        conn.execute(insert(t.rollup_tags).on_conflict_do_nothing(), tag_rows)
