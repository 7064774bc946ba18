"""A write batch's rows as the drivers take them: each exchange once, those not stored yet,
tuples in each table's column order (`rows` builds them so), fingerprint counts merged. Used
by both writers (`sqlite_writer`, `pg_writer`)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import cache
from itertools import chain
from operator import attrgetter, itemgetter
from typing import Any

import sqlalchemy as sa

from proxy.store import tables as t
from proxy.store.logprob_rows import Record
from proxy.store.rows import Row, Rows


def unique(batch: Sequence[Rows]) -> dict[str, Rows]:
    """The batch by exchange id, each id once (the first occurrence wins)."""
    by_id: dict[str, Rows] = {}
    for rows in batch:
        by_id.setdefault(str(rows.exchange[0]), rows)  # `Rows.id`, without the call
    return by_id


def not_stored(by_id: dict[str, Rows], stored: Iterable[str]) -> list[Rows]:
    """The batch's exchanges whose ids are not among `stored`: what a writer inserts.

    Each writer asks its database which of `by_id` it holds, in the batch's transaction, so a
    batch replayed after an unknown commit outcome writes nothing twice."""
    known = set(stored)
    return [rows for exchange_id, rows in by_id.items() if exchange_id not in known]


_CHILDREN = ("tags", "completions", "choices", "usage", "raw_streams", "logprobs")


def table_records(fresh: Sequence[Rows]) -> Iterator[tuple[sa.Table, list[Record]]]:
    """(table, records) to insert for exchanges not stored yet, parents first, none empty;
    each record a tuple of the table's columns in declared order (as `rows_for` builds it)."""
    # map and chain: a batch's hundreds of rows gathered without a Python step each.
    if fresh:
        yield t.exchanges, list(map(_EXCHANGE, fresh))
    for table, get in _CHILDREN_OF:
        children = list(chain.from_iterable(map(get, fresh)))
        if children:
            yield table, children


_EXCHANGE = attrgetter("exchange")
_CHILDREN_OF = tuple((t.metadata.tables[name], attrgetter(name)) for name in _CHILDREN)


def columns(table: sa.Table) -> list[str]:
    """The table's column names in its declared order: the order of `records`' tuples."""
    return _columns(table)[0]


@cache
def _columns(table: sa.Table) -> tuple[list[str], itemgetter[Any]]:
    # Plain interned strings: SQLAlchemy's names are a str subclass, which a dict keyed by
    # the rows' literal names looks up by comparing text instead of by identity.
    names = [sys.intern(str(column.name)) for column in table.columns]
    return names, itemgetter(*names)


def records(table: sa.Table, rows: list[Row]) -> list[tuple[Any, ...]]:
    """Rows as the drivers take them: tuples of the table's columns in declared order. A row
    missing a column raises KeyError here rather than shifting its values."""
    return list(map(record_getter(table), rows))


def record_getter(table: sa.Table) -> Callable[[Row], tuple[Any, ...]]:
    """What `records` makes of one row, for a writer that flattens rows as it goes."""
    return _columns(table)[1]


def merged_fingerprints(seen: list[Row]) -> list[Row]:
    """One row per (upstream, model, fingerprint): counts summed, first and last seen kept.

    Sorted by key: processes sharing a database lock fingerprint rows in the same order, so
    concurrent batches wait for each other instead of deadlocking.
    """
    merged: dict[tuple[str, str, str], Row] = {}
    for row in seen:
        key = (row["upstream"], row["model"], row["system_fingerprint"])
        if (known := merged.get(key)) is None:
            merged[key] = dict(row)
            continue
        known["count"] += 1
        if row["first_seen"] < known["first_seen"]:  # min() and max(), without the calls
            known["first_seen"] = row["first_seen"]
        if row["last_seen"] > known["last_seen"]:
            known["last_seen"] = row["last_seen"]
    return [merged[key] for key in sorted(merged)]


MAX_IN_LIST = 512
"""Values in one `IN (...)` of the SQLite writer's lookups."""


def in_lists(values: list[str]) -> Iterator[tuple[str, list[str]]]:
    """(placeholders, values) for each `IN (...)` of SQLite's lookups of `values`, at most
    `MAX_IN_LIST` values each, padded to a power of two with the last value repeated (which
    matches nothing more): one of ten texts (1 to 512 placeholders) for lookups of any length,
    which sqlite3's statement cache keeps prepared (`sqlite_writer.spans`)."""
    for start in range(0, len(values), MAX_IN_LIST):
        part = values[start : start + MAX_IN_LIST]
        size = 1 << (len(part) - 1).bit_length()
        yield _marks(size), part + part[-1:] * (size - len(part))


@cache
def _marks(count: int) -> str:
    return ", ".join("?" * count)
