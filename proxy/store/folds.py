"""Folded facet rows: the overview's top lists over long ranges read a few rows per value.

The top lists group every facet row of a range by value; over 90 days that is every day's
row of every model, key, user and tag. So the overview keeps, beside the writer's `hour` and
`day` rows, rows that sum aligned runs of them (`LEVELS`): 2, 4 and 8 hours (`h2`..`h8`), and
2 to 64 days (`d2`..`d64`), each starting at a multiple of its length counted from the epoch.
A range's whole hours and days are then cut into the fewest such runs (`tiles`: at most two
of each length), read from their folded rows where those are current, else from their
halves, down to the writer's own rows.

Folded rows are a cache the writer never touches: the overview writes them (`fold`), one
run at a time, for runs that have ended, from the `hour` or `day` rows themselves in one
statement. A folded run holds the `all` facet beside the top dimensions, and a run is used
only while its `all` row equals the sum of the `all` rows of the hours or days it covers,
read with the series: the writer only ever adds to facet rows, and every exchange it adds
counts in `all`, so a run that an exchange written since (a journal replayed late) has made
stale no longer matches and is read from its halves until it is folded again. A database the
overview cannot write to (a read-only replica, a locked file) is read from the halves.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from proxy.store import tables as t

log = logging.getLogger(__name__)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
STEP = {"hour": timedelta(hours=1), "day": timedelta(days=1)}
LEVELS: dict[str, tuple[str, int]] = {
    **{f"h{n}": ("hour", n) for n in (2, 4, 8)},  # 8 divides 24: a run stays inside its day
    **{f"d{n}": ("day", n) for n in (2, 4, 8, 16, 32, 64)},
}
"""Folded span -> (the writer's span it sums, how many of them)."""
NAMES = {value: name for name, value in LEVELS.items()}
SUMS = t.FACET_SUMS
KEPT = t.FACET_TOP[2:]
"""The sums a folded row holds (the top lists'); its other sums are 0."""
_KEPT_AT = [SUMS.index(name) for name in KEPT]
Unit = tuple[str, int, int]
"""(span, index of its first hour or day since the epoch, length in them)."""


def index(at: datetime, base: str) -> int:
    return (at - EPOCH) // STEP[base]


def start(base: str, at: int) -> datetime:
    return EPOCH + at * STEP[base]


def tiles(base: str, lo: int, hi: int) -> list[tuple[int, int]]:
    """[lo, hi) cut into aligned runs, longest first: (first, length), in order."""
    lengths = [1, *(n for b, n in LEVELS.values() if b == base)]
    out = []
    while lo < hi:
        length = max(n for n in lengths if lo % n == 0 and lo + n <= hi)
        out.append((lo, length))
        lo += length
    return out


def plan(
    base: str,
    lo: int,
    hi: int,
    present: Mapping[int, Sequence[int]],
    folded: Mapping[tuple[str, int], Sequence[int]],
    ended: int,
) -> tuple[list[Unit], list[tuple[Unit, list[Unit]]]]:
    """What to read for [lo, hi) of `base`: each of its runs from its folded rows where they
    are current, else from its halves, down to the single hours or days that have rows; and
    the runs to fold (ended before `ended`, read from more than one unit), each with the
    units it is read from. `present`: the `all` sums (`CHECKED`) of each hour or day with
    rows; `folded`: those of each folded run."""
    read: list[Unit] = []
    stale: list[tuple[Unit, list[Unit]]] = []

    def cover(first: int, length: int, into: list[Unit]) -> None:
        inside = [present[i] for i in range(first, first + length) if i in present]
        if not inside:
            return  # no exchange: nothing to read
        if length == 1:
            into.append((base, first, 1))
            return
        name = NAMES[(base, length)]
        if list(folded.get((name, first), ())) == [sum(c) for c in zip(*inside, strict=True)]:
            into.append((name, first, length))
            return
        half = length // 2
        cover(first, half, into)
        cover(first + half, half, into)

    for first, length in tiles(base, lo, hi):
        parts: list[Unit] = []
        cover(first, length, parts)
        read += parts
        if len(parts) > 1 and first + length <= ended:
            stale.append(((NAMES[(base, length)], first, length), parts))
    return read, stale


def kept(sums: Sequence[int]) -> list[int]:
    """The `KEPT` sums of a full row of sums (`SUMS` order)."""
    return [sums[at] for at in _KEPT_AT]


async def folded(
    conn: AsyncConnection, lo: datetime, hi: datetime
) -> dict[tuple[str, int], list[int]]:
    """The `all` sums (`KEPT`) of the folded runs starting in [lo, hi)."""
    f = t.facets
    query = sa.select(f.c.span, f.c.start, *(f.c[name] for name in KEPT)).where(
        f.c.dim == "all", f.c.span.in_(LEVELS), f.c.start >= lo, f.c.start < hi
    )
    out = {}
    for row in await conn.execute(query):
        at = row[1].replace(tzinfo=UTC) if row[1].tzinfo is None else row[1].astimezone(UTC)
        out[(row[0], index(at, LEVELS[row[0]][0]))] = [int(value) for value in row[2:]]
    return out


def rows_of(units: Sequence[Unit], dims: Sequence[str]) -> Any:
    """`dim`, `value`, `hint` and the `KEPT` sums of the facet rows of `dims` in `units`
    (single hours or days next to each other in `units` as one range): a UNION ALL of one
    SELECT per range, each read from the index that holds those columns (`ix_facets_top`).

    Two single hours or days next to each other in `units` are one range even with a gap
    between them: `plan` leaves out only the hours and days without rows, and a folded run
    between them would stand between them in `units`. So a long history with gaps is still a
    few SELECTs (SQLite refuses a UNION of more than 500)."""
    f = t.facets
    ranges: list[tuple[str, datetime, datetime]] = []
    for span, first, length in units:
        base = LEVELS[span][0] if span in LEVELS else span
        lo, hi = start(base, first), start(base, first + length)
        if length == 1 and ranges and ranges[-1][0] == span and ranges[-1][2] <= lo:
            ranges[-1] = (span, ranges[-1][1], hi)
        elif length == 1:
            ranges.append((span, lo, hi))
        else:
            ranges.append((span, lo, lo + STEP[base]))  # a folded row starts at its run's start
    selects = [
        sa.select(f.c.dim, f.c.value, f.c.hint, *(f.c[name] for name in KEPT)).where(
            f.c.dim.in_(dims), f.c.span == span, f.c.start >= lo, f.c.start < hi
        )
        for span, lo, hi in ranges
    ]
    return sa.union_all(*selects).subquery() if len(selects) > 1 else selects[0].subquery()


def grouped(units: Sequence[Unit], dims: Sequence[str]) -> sa.Select[Any]:
    """The rows of `units` summed per `dim` and `value`."""
    rows = rows_of(units, dims)
    return sa.select(
        rows.c.dim,
        rows.c.value,
        sa.func.max(rows.c.hint).label("hint"),
        *(sa.func.sum(rows.c[name]).label(name) for name in KEPT),
    ).group_by(rows.c.dim, rows.c.value)


def fold_statement(dialect: str, unit: Unit, parts: Sequence[Unit], dims: Sequence[str]) -> Any:
    """Replace the folded rows of `unit` with the sums of `parts`, the units that cover it."""
    f = t.facets
    name, first, _ = unit
    summed = grouped(parts, dims).subquery()
    zero = sa.literal(0, sa.BigInteger())
    rest = [name for name in SUMS if name not in KEPT]
    select = sa.select(
        summed.c.dim,
        sa.literal(name, f.c.span.type),
        sa.literal(start(LEVELS[name][0], first), f.c.start.type),
        summed.c.value,
        summed.c.hint,
        *(summed.c[column] for column in KEPT),
        *(zero for _ in rest),
    ).where(sa.true())  # SQLite reads `ON CONFLICT` after a bare FROM as a join's ON
    if dialect == "postgresql":  # rows locked in key order: two folds of one run wait, not deadlock
        select = select.order_by(summed.c.dim, summed.c.value)
    insert = postgresql.insert(f) if dialect == "postgresql" else sqlite.insert(f)
    statement = insert.from_select(["dim", "span", "start", "value", "hint", *KEPT, *rest], select)
    replaced = {column: statement.excluded[column] for column in ("hint", *KEPT)}
    return statement.on_conflict_do_update(index_elements=["dim", "span", "start", "value"],
                                           set_=replaced)  # fmt: skip


async def fold(
    engine: AsyncEngine, stale: Sequence[tuple[Unit, list[Unit]]], dims: Sequence[str]
) -> int:
    """Fold each run of `stale` from its parts, each in a transaction of its own (a short
    hold of SQLite's write lock); stops at the first the database refuses (read-only, locked)
    and says how many it did."""
    done = 0
    for unit, parts in stale:
        try:
            async with engine.begin() as conn:
                await conn.execute(fold_statement(engine.dialect.name, unit, parts, dims))
        except sa.exc.DBAPIError as exc:
            log.debug("overview: folded rows not written (%s): read from the hours and days", exc)
            return done
        done += 1
    return done
