"""The overview's running sums (`tables.facets`), kept by the writer as it writes.

Every exchange the writer inserts adds itself, in the same transaction, to one row per UTC
hour and one per UTC day of each of its facets: `all`, its upstream, its model (the answering
one, else the requested: what `cost --by model` groups on), each model it names (`model_any`:
what the `model` filter matches), its key, its user and each of its tags. A row holds what
the cost report sums (requests, tokens, cost in whole nano-dollars, priced and unpriced
counts, computed here exactly as `report.py` computes them in SQL), errors (outcome not `ok`)
and two latency histograms (duration, time to first token) on `tables.LATENCY_BOUNDS_MS`.

Only exchanges actually inserted are added (the writers pass the batch's fresh rows), so a
batch the journal replays adds nothing twice. Rows are upserted in key order: writers in
several processes lock them in the same order and wait rather than deadlock.

`add` is pure; migration 0008 fills the table from stored exchanges with it (`add_rows`),
and the reading side (`overview.py`, `facet_sql.py`) sums the exchanges at the ragged edges
of a time range in SQL by the same rules.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from math import isfinite
from operator import itemgetter
from typing import Any

import sqlalchemy as sa

from proxy.store import tables as t

Facet = dict[str, Any]
SUMS = t.FACET_SUMS
SPANS = ("hour", "day")
FREE_ENDPOINT = "/moderations"
"""Names a model, succeeds and costs nothing: never unpriced (as `report.FREE_ENDPOINT`)."""
TOKENS = ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens")
KEY = ("dim", "span", "start", "value")
"""The primary key of `facets`, the order rows are upserted in."""
_DURATION = SUMS.index("d0")
_TTFT = SUMS.index("t0")


def span_start(at: datetime, span: str) -> datetime:
    """The UTC hour or day `at` falls in."""
    at = at.astimezone(UTC)
    if span == "hour":
        return at.replace(minute=0, second=0, microsecond=0)
    return at.replace(hour=0, minute=0, second=0, microsecond=0)


def cost_nano(cost: float | None) -> int:
    """Whole nano-dollars as the report's SQL rounds them (`round(cost * 1e9)`, half away
    from zero, on the same double)."""
    if cost is None:
        return 0
    scaled = cost * 1e9
    return math.floor(abs(scaled) + 0.5) * (1 if scaled >= 0 else -1)


def is_unpriced(exchange: Mapping[str, Any], has_usage: bool) -> bool:
    """`report.is_unpriced`, on one exchange's row."""
    if exchange["cost_usd"] is not None:
        return False
    status = exchange["status"]
    paid = (
        exchange["model"] is not None
        and status is not None
        and status < 400
        and not str(exchange["path"]).endswith(FREE_ENDPOINT)
    )
    return has_usage or exchange["usage_source"] == "missing" or paid


def _bucket(ms: float | None) -> int | None:
    if ms is None or not math.isfinite(ms):
        return None
    return bisect_right(_FLOAT_BOUNDS, ms)


_FLOAT_BOUNDS = tuple(map(float, t.LATENCY_BOUNDS_MS))
"""The bounds as floats, for `bisect`: a float compares faster with a float than with an int,
and every bound is a whole number a float holds exactly."""


def vector(exchange: Mapping[str, Any], usage: Mapping[str, Any] | None) -> list[int]:
    """What one exchange adds to each of its facet rows, in `SUMS` order."""
    sums = [0] * len(SUMS)
    sums[0] = 1
    sums[1] = int(exchange["outcome"] != "ok")
    if usage is not None:
        for at, name in enumerate(TOKENS, start=2):
            sums[at] = int(usage.get(name) or 0)
    sums[6] = cost_nano(exchange["cost_usd"])
    sums[7] = int(exchange["cost_usd"] is not None)
    sums[8] = int(is_unpriced(exchange, usage is not None))
    duration, ttft = _bucket(exchange["duration_ms"]), _bucket(exchange["ttft_ms"])
    if duration is not None:
        sums[_DURATION + duration] = 1
    if ttft is not None:
        sums[_TTFT + ttft] = 1
    return sums


def dimensions(
    exchange: Mapping[str, Any], tags: Iterable[tuple[str, str]]
) -> list[tuple[str, str, str | None]]:
    """(dim, value, hint) of each facet the exchange counts in."""
    model, answered = exchange["model"], exchange["response_model"]
    found: list[tuple[str, str, str | None]] = [
        ("all", "", None),
        ("upstream", exchange["upstream"] or "", None),
    ]
    # The groups of `cost --by model`, `key` and `user`: SQL's coalesce and NULL, not truth.
    if answered is not None or model is not None:
        found.append(("model", answered if answered is not None else model, None))
    found += [("model_any", name, None) for name in dict.fromkeys((model, answered)) if name]
    if exchange["key_hash"] is not None:
        found.append(("key", exchange["key_hash"], exchange["key_hint"]))
    if exchange["end_user"] is not None:
        found.append(("user", exchange["end_user"], None))
    found += [("tag", f"{key}={value}", None) for key, value in tags]
    return found


FacetKey = tuple[str, str, datetime, str]
COLUMNS = ("dim", "span", "start", "value", "hint", *SUMS)
"""A facet row as the writer builds it: a list in this order (the table's, checked in
tests/store), so it goes to the driver as it is; `SUM_AT` is where its sums start."""
SUM_AT = COLUMNS.index(SUMS[0])


def add(
    into: dict[FacetKey, list[Any]],
    exchange: Mapping[str, Any],
    usage: Mapping[str, Any] | None,
    tags: Iterable[tuple[str, str]],
    spans: Sequence[str] = SPANS,
) -> None:
    """Add one exchange (an `exchanges` row, its `usage` row or None, its tags) to `into`.

    Every exchange of a batch adds to one row per facet and span (a dozen or so), and most
    add to rows already there: a row is a list, and only the exchange's non-zero sums are
    added to it."""
    at = exchange["started_at"]
    starts = [(span, span_start(at, span)) for span in spans]
    _add_sums(into, dimensions(exchange, tags), starts, vector(exchange, usage))


def _add_sums(
    into: dict[FacetKey, list[Any]],
    found: list[tuple[str, str, str | None]],
    starts: Iterable[tuple[str, datetime]],
    sums: list[int],
) -> None:
    """Add `sums` to the row of each facet in `found` (`dimensions`) at each (span, start)."""
    given = [(at, amount) for at, amount in enumerate(sums, start=SUM_AT) if amount]
    for span, start in starts:
        for dim, value, hint in found:
            key = (dim, span, start, value)
            row = into.get(key)
            if row is None:
                into[key] = [dim, span, start, value, hint, *sums]
                continue
            for index, amount in given:
                row[index] += amount
            if row[4] is None:
                row[4] = hint


def of_batch(fresh: Iterable[Any]) -> list[list[Any]]:
    """The facet rows (`COLUMNS`) of the exchanges a writer inserts (`rows.Rows`), merged, in
    key order: the rows `add` makes of them one by one.

    Most exchanges of a batch share all their facets and their hour, so they are summed by
    what decides their facet rows first (upstream, models, key, user, tags, hour), and each
    such group is added to its dozen rows once. Groups go in the order they first appear, so
    a row's hint is still the first one its exchanges name."""
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for rows in fresh:
        record = rows.exchange
        tags = tuple([(tag[1], tag[2]) for tag in rows.tags]) if rows.tags else ()
        at = record[_STARTED_AT]
        # A UTC hour as its numbers: a datetime's hash looks up its offset, and `span_start`
        # builds a datetime; the hour's datetime is built once a group instead.
        if at.tzinfo is UTC:
            shared = (*_SHARED(record), tags, at.hour, at.day, at.month, at.year)
        else:
            shared = (*_SHARED(record), tags, span_start(at, "hour"))
        group = groups.get(shared)
        if group is None:
            hour = span_start(at, "hour")
            groups[shared] = group = [_named(record), tags, hour, [0] * len(SUMS)]
        _sum(group[3], record, rows.usage[0] if rows.usage else None)
    into: dict[FacetKey, list[Any]] = {}
    for ex, tags, hour, sums in groups.values():
        starts = (("hour", hour), ("day", hour.replace(hour=0)))
        _add_sums(into, dimensions(ex, tags), starts, sums)
    return [into[key] for key in sorted(into)]


def _sum(sums: list[int], record: tuple[Any, ...], usage: tuple[Any, ...] | None) -> None:
    """Add `vector` of a writer's record (`rows.Rows.exchange`) and its usage record to
    `sums`, touching only what it may make non-zero."""
    sums[0] += 1
    if record[_OUTCOME] != "ok":
        sums[1] += 1
    if usage is not None:
        prompt, cached, completion, reasoning = _USAGE_TOKENS(usage)
        sums[2] += int(prompt or 0)  # `TOKENS`, in order
        sums[3] += int(cached or 0)
        sums[4] += int(completion or 0)
        sums[5] += int(reasoning or 0)
    cost = record[_COST_USD]
    if cost is not None:
        sums[6] += cost_nano(cost)
        sums[7] += 1
    elif is_unpriced(_named(record), usage is not None):
        sums[8] += 1
    # `_bucket`, written out: the record's times are floats or None (`rows`).
    duration, ttft = record[_DURATION_MS], record[_TTFT_MS]
    if duration is not None and isfinite(duration):
        sums[_DURATION + bisect_right(_FLOAT_BOUNDS, duration)] += 1
    if ttft is not None and isfinite(ttft):
        sums[_TTFT + bisect_right(_FLOAT_BOUNDS, ttft)] += 1


def upsert_sql(dialect: str) -> str:
    """Insert a facet row or add it to the stored one (`$n` marks for asyncpg, `?` for
    sqlite3); a key's first hint stays."""
    names = COLUMNS
    if dialect == "postgresql":
        marks = ", ".join(f"${i}" for i in range(1, len(names) + 1))
        added = [f"{n} = facets.{n} + excluded.{n}" for n in SUMS]
        hint = "hint = coalesce(facets.hint, excluded.hint)"
    else:
        marks = ", ".join("?" * len(names))
        added = [f"{n} = {n} + excluded.{n}" for n in SUMS]
        hint = "hint = coalesce(hint, excluded.hint)"
    return (
        f"INSERT INTO facets ({', '.join(names)}) VALUES ({marks}) "
        f"ON CONFLICT ({', '.join(KEY)}) DO UPDATE SET {', '.join([*added, hint])}"
    )


def records(found: list[list[Any]], time: Any = None) -> list[tuple[Any, ...]]:
    """Facet rows (`of_batch`) as the drivers take them; `time` converts `start` (SQLite's
    text)."""
    if time is None:
        return [tuple(row) for row in found]
    starts = {row[2]: None for row in found}  # a batch's rows share an hour and a day or two
    text = {start: time(start) for start in starts}
    return [(row[0], row[1], text[row[2]], *row[3:]) for row in found]


def percentile(counts: Sequence[int], q: float) -> float | None:
    """The q-quantile (0-1) of a histogram on `LATENCY_BOUNDS_MS`, interpolated on a log scale
    inside its bucket; None when empty."""
    total = sum(counts)
    if total == 0:
        return None
    bounds = t.LATENCY_BOUNDS_MS
    rank = q * total
    seen = 0
    for at, count in enumerate(counts):
        if count and seen + count >= rank:
            if at >= len(bounds):
                return float(bounds[-1])
            low = bounds[at - 1] if at else bounds[0] / 2
            share = (rank - seen) / count
            return float(low * (bounds[at] / low) ** share)
        seen += count
    return float(bounds[-1])


_ROW = (
    *("started_at", "upstream", "model", "response_model", "key_hash", "key_hint", "end_user"),
    *("outcome", "status", "path", "usage_source", "cost_usd", "duration_ms", "ttft_ms"),
)
"""What `add` reads of an exchange: of a stored one (`exchanges_query`), or of a writer's
record (`rows.Rows.exchange`, read by index)."""
_FIELDS = itemgetter(*(t.EXCHANGE_AT[name] for name in _ROW))
_SHARED = itemgetter(
    *(t.EXCHANGE_AT[name] for name in _ROW[1:7])  # upstream, models, key, user
)
_USAGE_TOKENS = itemgetter(*(t.usage.columns.keys().index(name) for name in TOKENS))
_STARTED_AT, _OUTCOME, _COST_USD, _DURATION_MS, _TTFT_MS = (
    t.EXCHANGE_AT[name] for name in ("started_at", "outcome", "cost_usd", "duration_ms", "ttft_ms")
)


def _named(record: tuple[Any, ...]) -> dict[str, Any]:
    """What `add` reads of a writer's record, by name."""
    return dict(zip(_ROW, _FIELDS(record), strict=True))


def exchanges_query() -> sa.Select[Any]:
    """What `add` needs of stored exchanges (`usage_id` is null without a usage row), by id;
    the caller adds its conditions."""
    ex, usage = t.exchanges, t.usage
    return (
        sa.select(
            ex.c.id,
            *(ex.c[name] for name in _ROW),
            usage.c.exchange_id.label("usage_id"),
            *(usage.c[name] for name in TOKENS),
        )
        .select_from(ex.outerjoin(usage, usage.c.exchange_id == ex.c.id))
        .order_by(ex.c.id)
    )


def tags_query(ids: Sequence[str]) -> sa.Select[Any]:
    return sa.select(t.tags).where(t.tags.c.exchange_id.in_(ids))


def add_rows(
    into: dict[FacetKey, list[Any]],
    found: Sequence[Any],
    tags: Iterable[Any],
    spans: Sequence[str] = SPANS,
) -> None:
    """Add rows of `exchanges_query` (their `tags_query` rows beside) to `into`."""
    tagged: dict[str, list[tuple[str, str]]] = {}
    for tag in tags:
        tagged.setdefault(tag.exchange_id, []).append((tag.key, tag.value))
    for row in found:
        values = row._asdict()
        at = values["started_at"]
        if at.tzinfo is None:  # SQLite hands back naive UTC
            values["started_at"] = at.replace(tzinfo=UTC)
        usage = values if values["usage_id"] is not None else None
        add(into, values, usage, tagged.get(values["id"], []), spans)
