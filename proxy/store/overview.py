"""The overview (`GET /api/overview`, the console's `/`): totals, a time series and the top
groups by spend, for the filters of the list.

It reads the writer's running sums (`facets.py`), a few rows per bucket, not the exchanges:
a range is cut into whole days and whole hours, read from `facets`, and the ragged minutes at
its two ends, summed from the exchanges themselves with the same code, so the totals are
exact for any `since`/`until` and agree with `flightrec cost` to the last nano-dollar.

Which filters the sums answer: the time range and at most one of `model`, `key`, `user`,
`upstream` or one `tag` (for the totals and the series); the top lists under such a filter,
and any other filter (`outcome`, `status`, `q`, ...), are summed from the exchanges.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from proxy.store import facet_sql, facets, folds
from proxy.store import tables as t
from proxy.store.browse import ListFilters

TOP = ("model", "key", "user", "tag")
Stale = list[tuple[folds.Unit, list[folds.Unit]]]
"""Folded runs to write, each with the units it is summed from (`folds.plan`)."""
FoldLater = Callable[[Stale], None]
TOP_SIZE = 10
HOUR_BUCKETS_UP_TO = timedelta(days=3)
"""A range up to this long is drawn by the hour, a longer one by the day."""
NANO = Decimal("1e-9")
_SUMS = facets.SUMS
_HIST = (_SUMS.index("d0"), _SUMS.index("t0"), t.HISTOGRAM)
Segment = tuple[str, datetime, datetime]
POINT = ("start", "requests", "errors", "cost_usd", "p50_ms", "p95_ms", "ttft_p50_ms")
"""The fields of each point of the series, in order (SPEC section 8)."""


def _floor(at: datetime, span: str) -> datetime:
    return facets.span_start(at, span)


def _ceil(at: datetime, span: str) -> datetime:
    start = _floor(at, span)
    step = timedelta(hours=1) if span == "hour" else timedelta(days=1)
    return start if start == at else start + step


def segments(since: datetime, until: datetime, bucket: str) -> list[Segment]:
    """[since, until) as (`raw` | `hour` | `day`, start, end) pieces, in time order."""
    h1, h2 = _ceil(since, "hour"), _floor(until, "hour")
    if h1 >= h2:
        return [("raw", since, until)]
    out: list[Segment] = [("raw", since, h1)] if since < h1 else []
    d1, d2 = _ceil(h1, "day"), _floor(h2, "day")
    if bucket == "day" and d1 < d2:
        out += [("hour", h1, d1)] if h1 < d1 else []
        out.append(("day", d1, d2))
        out += [("hour", d2, h2)] if d2 < h2 else []
    else:
        out.append(("hour", h1, h2))
    return out + ([("raw", h2, until)] if h2 < until else [])


def facet_filter(filters: ListFilters) -> tuple[str, sa.ColumnElement[bool] | None] | None:
    """(dim, condition on `facets.value`/`hint`) that stands for the filters, ('all', None)
    for none, or None when the sums cannot answer them."""
    base, f = filters.base, t.facets
    found: list[tuple[str, sa.ColumnElement[bool]]] = []
    if base.model is not None:
        found.append(("model_any", f.c.value == base.model))
    if base.key is not None:
        by_hash = f.c.value.startswith(base.key.lower(), autoescape=True)
        found.append(("key", sa.or_(f.c.hint == base.key, by_hash)))
    found += [("tag", f.c.value == f"{k}={v}") for k, v in base.tags]
    if filters.user is not None:
        found.append(("user", f.c.value == filters.user))
    if filters.upstream is not None:
        found.append(("upstream", f.c.value == filters.upstream))
    rest_base = dataclasses.replace(base, since=None, until=None, model=None, key=None, tags=())
    rest = dataclasses.replace(filters, base=rest_base, user=None, upstream=None)
    if rest != ListFilters() or len(found) > 1:
        return None
    return found[0] if found else ("all", None)


def _zero() -> list[int]:
    return [0] * len(_SUMS)


def _plus(into: list[int], row: Any) -> None:
    for at, name in enumerate(_SUMS):
        into[at] += int(row[name] or 0)


async def _sums_of_table(
    conn: AsyncConnection, seg: Segment, dim: str, where: sa.ColumnElement[bool] | None
) -> list[tuple[datetime, list[int]]]:
    f = t.facets
    span, lo, hi = seg
    query = (
        sa.select(f.c.start, *(sa.func.sum(f.c[name]).label(name) for name in _SUMS))
        .where(f.c.dim == dim, f.c.span == span, f.c.start >= lo, f.c.start < hi)
        .group_by(f.c.start)
    )
    if where is not None:
        query = query.where(where)
    out = []
    for row in (await conn.execute(query)).mappings():
        sums = _zero()
        _plus(sums, row)
        out.append((_utc(row["start"]), sums))
    return out


async def _raw(
    conn: AsyncConnection,
    filters: ListFilters,
    lo: datetime,
    hi: datetime,
    dims: tuple[str, ...] = TOP,
) -> list[facets.Facet]:
    """The exchanges in [lo, hi) that match `filters`, summed by the database per hour (`all`)
    and per group of `dims`."""
    base = dataclasses.replace(filters.base, since=lo, until=hi)
    where = dataclasses.replace(filters, base=base).where()
    if hi - lo <= timedelta(hours=1):
        return await facet_sql.summed_short(conn, where, dims)
    return await facet_sql.summed(conn, where, dims)


def _utc(at: datetime) -> datetime:
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


async def _earliest(conn: AsyncConnection) -> datetime | None:
    f = t.facets
    query = sa.select(sa.func.min(f.c.start)).where(f.c.dim == "all", f.c.span == "day")
    found = (await conn.execute(query)).scalar()
    return None if found is None else _utc(found)


async def _series(
    conn: AsyncConnection,
    chosen: tuple[str, Any] | None,
    cut: list[Segment],
    raw: dict[Segment, list[facets.Facet]],
) -> list[tuple[datetime, list[int]]]:
    """(start, sums) of hours or days, in any order, covering the segments."""
    out: list[tuple[datetime, list[int]]] = []
    for seg in cut:
        if seg in raw:
            for row in raw[seg]:
                if row["dim"] == "all":
                    sums = _zero()
                    _plus(sums, row)
                    out.append((row["start"], sums))
        elif chosen is not None:
            out += await _sums_of_table(conn, seg, chosen[0], chosen[1])
    return out


async def _top_of_folds(
    engine: AsyncEngine,
    conn: AsyncConnection,
    cut: list[Segment],
    found: list[tuple[datetime, list[int]]],
    fold_later: FoldLater | None,
) -> list[Any]:
    """The top groups of the whole hours and days of `cut`, read from the fewest folded runs
    that are current (`folds.py`). The runs that have ended and are not current are folded
    first, or, given `fold_later`, handed to it and read from their halves this time."""
    whole = [seg for seg in cut if seg[0] != "raw"]
    if not whole:
        return []
    present: dict[str, dict[int, list[int]]] = {"hour": {}, "day": {}}
    for at, sums in found:
        for span, lo, hi in whole:
            if lo <= at < hi:
                present[span][folds.index(at, span)] = folds.kept(sums)
    now = datetime.now(UTC)
    ended = {span: folds.index(_floor(now, span), span) for span in present}

    def planned(have: dict[tuple[str, int], list[int]]) -> tuple[list[Any], list[Any]]:
        read, stale = [], []
        for span, lo, hi in whole:
            got = folds.plan(span, folds.index(lo, span), folds.index(hi, span), present[span],
                             have, ended[span])  # fmt: skip
            read += got[0]
            stale += got[1]
        return read, stale

    read, stale = planned(await folds.folded(conn, whole[0][1], whole[-1][2]))
    if stale and fold_later is not None:
        fold_later(stale)
    elif stale and await fold_top(engine, stale):
        read, stale = planned(await folds.folded(conn, whole[0][1], whole[-1][2]))
    if not read:
        return []
    return list((await conn.execute(folds.grouped(read, TOP))).mappings())


async def fold_top(engine: AsyncEngine, stale: Stale) -> int:
    """Write the folded rows of the top lists for `stale` (from `_top_of_folds`)."""
    return await folds.fold(engine, stale, ("all", *TOP))


def _top(rows: list[Any]) -> dict[str, list[dict[str, Any]]]:
    """The top lists of facet rows, summed per group."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for row in rows:
        if row["dim"] not in TOP:
            continue
        into = groups.setdefault((row["dim"], row["value"]), {"hint": None})
        for name in ("requests", "errors", "cost_nano", "priced", "unpriced"):
            into[name] = into.get(name, 0) + int(row[name] or 0)
        into["hint"] = into["hint"] or row["hint"]
    return _ranked(groups)


def _ranked(groups: dict[tuple[str, str], dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    top: dict[str, list[dict[str, Any]]] = {dim: [] for dim in TOP}
    for (dim, value), sums in groups.items():
        item = {
            "group": value,
            "requests": sums["requests"],
            "errors": sums["errors"],
            "cost_usd": _cost(sums["cost_nano"], sums["priced"], sums["unpriced"]),
            "unpriced_requests": sums["unpriced"],
        }
        if dim == "key":
            item["key_hint"] = sums["hint"]
        top[dim].append(item)
    for dim, items in top.items():
        items.sort(key=lambda i: (-(i["cost_usd"] or 0), -i["requests"], str(i["group"])))
        top[dim] = items[:TOP_SIZE]
    return top


def _cost(nano: int, priced: int, unpriced: int) -> float | None:
    """Exact (whole nano-dollars); None when every request with a cost had none."""
    return None if priced == 0 and unpriced else float(nano * NANO)


def _point(start: datetime, sums: Sequence[int]) -> dict[str, Any]:
    d, tt, n = _HIST
    return {
        "start": start.isoformat(),
        "requests": sums[0],
        "errors": sums[1],
        "prompt_tokens": sums[2],
        "completion_tokens": sums[4],
        "cost_usd": _cost(sums[6], sums[7], sums[8]),
        "unpriced_requests": sums[8],
        "p50_ms": facets.percentile(sums[d : d + n], 0.5),
        "p95_ms": facets.percentile(sums[d : d + n], 0.95),
        "ttft_p50_ms": facets.percentile(sums[tt : tt + n], 0.5),
    }


def buckets(since: datetime, until: datetime, bucket: str) -> list[datetime]:
    step = timedelta(hours=1) if bucket == "hour" else timedelta(days=1)
    at, out = _floor(since, bucket), []
    while at < until:
        out.append(at)
        at += step
    return out


async def overview(
    engine: AsyncEngine,
    filters: ListFilters | None = None,
    now: datetime | None = None,
    *,
    fold_later: FoldLater | None = None,
) -> dict[str, Any]:
    """`{"bucket", "since", "until", "points": [[start, requests, errors, cost_usd, p50_ms,
    p95_ms, ttft_p50_ms], ...], "totals": {...}, "top": {"model", "key", "user", "tag"}}`.
    `fold_later`: where the runs to fold go instead of being folded before the answer (the
    console's JSON API and pages only read; they fold in the background)."""
    filters = filters or ListFilters()
    until = filters.base.until or now or datetime.now(UTC)
    async with engine.connect() as conn:
        if conn.dialect.name == "postgresql":
            # Short queries over few rows: compiling them to machine code (JIT, on by default
            # above a planner cost these reach) takes longer than running them.
            await conn.exec_driver_sql("SET LOCAL jit = off")
        since = filters.base.since or await _earliest(conn) or until - timedelta(days=1)
        since = min(since, until)
        bucket = "hour" if until - since <= HOUR_BUCKETS_UP_TO else "day"
        cut = segments(since, until, bucket) if since < until else []
        chosen = facet_filter(filters)
        ragged = [seg for seg in cut if seg[0] == "raw" and chosen is not None]
        # Under a filter the top lists are summed over the whole range below: the ends add
        # only to the series.
        dims = TOP if chosen == ("all", None) else ()
        edges = {seg: await _raw(conn, filters, seg[1], seg[2], dims) for seg in ragged}
        if chosen == ("all", None):
            found = await _series(conn, chosen, cut, edges)
            stored = await _top_of_folds(engine, conn, cut, found, fold_later)
            top = _top([*stored, *(row for seg in ragged for row in edges[seg])])
        else:
            # The sums hold no cross-facet rows: a filter's top lists, and any filter they
            # cannot answer, are summed from the matching exchanges over the whole range.
            whole: Segment = ("raw", since, until)
            every = {whole: await _raw(conn, filters, since, until)} if cut else {}
            top = _top([row for rows in every.values() for row in rows])
            found = await _series(conn, chosen, *((cut, edges) if chosen else (list(every), every)))
    return shape(found, since, until, bucket, top)


def shape(
    found: list[tuple[datetime, list[int]]],
    since: datetime,
    until: datetime,
    bucket: str,
    top: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    per: dict[datetime, list[int]] = {at: _zero() for at in buckets(since, until, bucket)}
    total = _zero()
    for start, sums in found:
        into = per.setdefault(_floor(start, bucket), _zero())
        for at, value in enumerate(sums):
            into[at] += value
            total[at] += value
    points = [_point(at, per[at]) for at in sorted(per)]
    summed = _point(since, total)
    keys = (
        *("requests", "errors", "cost_usd", "unpriced_requests", "prompt_tokens"),
        *("completion_tokens", "p50_ms", "p95_ms", "ttft_p50_ms"),
    )
    return {
        "bucket": bucket,
        "since": since.isoformat(),
        "until": until.isoformat(),
        "points": [[p[name] for name in POINT] for p in points],
        "totals": {key: summed[key] for key in keys},
        "top": top,
    }


async def choices(engine: AsyncEngine, dim: str, most: int = 500) -> list[tuple[str, str | None]]:
    """The values a facet has taken (and a key's hint), for the console's select boxes."""
    f = t.facets
    query = (
        sa.select(f.c.value, sa.func.max(f.c.hint))
        .where(f.c.dim == dim, f.c.span == "day")
        .group_by(f.c.value)
        .order_by(f.c.value)
        .limit(most)
    )
    async with engine.connect() as conn:
        return [(row[0], row[1]) for row in await conn.execute(query)]
