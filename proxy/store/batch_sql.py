"""The writers' Batch API statements (SPEC 12), inside each batch's transaction.

`book_*` runs before a batch's exchanges are inserted: it stores the input lines and the batches
the batch's exchanges saw, and books its result lines (`Rows.booking`): a result's
`batch_results` row is inserted only if its line id is not there yet, and a result whose row
was there is dropped from the batch, never inserted. The database decides, not a process's
memory: on PostgreSQL a second transaction booking the same line waits for the first and then
books nothing (`ON CONFLICT DO NOTHING`); SQLite's writers take the database's write lock
first (`BEGIN IMMEDIATE`), so its check-then-insert cannot interleave.

`link_*` runs after the inserts: results whose batch is now known get its id, and results
whose request line is now known get it as their exchange's request, its `model` and its path,
whichever of the upload, the batch and the output file came first.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import asyncpg  # type: ignore[import-untyped]

from proxy.store import tables as t
from proxy.store.records import columns, in_lists
from proxy.store.rows import Row, Rows

_BATCH_UPSERT = """\
INSERT INTO batches ({columns}) VALUES ({marks})
ON CONFLICT (id) DO UPDATE SET
    status = excluded.status,
    endpoint = coalesce(excluded.endpoint, batches.endpoint),
    input_file_id = coalesce(excluded.input_file_id, batches.input_file_id),
    output_file_id = coalesce(excluded.output_file_id, batches.output_file_id),
    error_file_id = coalesce(excluded.error_file_id, batches.error_file_id),
    created_at = coalesce(excluded.created_at, batches.created_at),
    seen_at = excluded.seen_at,
    request_counts = excluded.request_counts,
    exchange_id = excluded.exchange_id
WHERE excluded.seen_at >= batches.seen_at"""
"""A batch seen again replaces what an earlier sighting said; an older sighting written late
changes nothing."""
_REQUESTS_INSERT = "INSERT INTO batch_requests ({columns}) VALUES ({marks}) ON CONFLICT DO NOTHING"
_RESULTS_BOOK_PG = """\
INSERT INTO batch_results (line_id, file_id, batch_id, custom_id, exchange_id, booked_at)
SELECT * FROM unnest($1::varchar[], $2::varchar[], $3::varchar[], $4::varchar[],
                     $5::varchar[], $6::timestamptz[])
ON CONFLICT (line_id) DO NOTHING
RETURNING line_id"""
_LINK_BATCH = """\
UPDATE batch_results SET batch_id = (
    SELECT b.id FROM batches b
    WHERE b.output_file_id = batch_results.file_id OR b.error_file_id = batch_results.file_id
    ORDER BY b.id LIMIT 1)
WHERE batch_id IS NULL AND {column} {match}"""
"""Results (of these files, or these exchanges) learn their batch."""
_LINK_REQUEST = """\
UPDATE exchanges SET
    request = found.body,
    model = coalesce(exchanges.model, found.model),
    path = coalesce(found.url, exchanges.path)
FROM (
    SELECT r.exchange_id, q.body, q.model, q.url
    FROM batch_results r
    JOIN batches b ON b.id = r.batch_id
    JOIN batch_requests q ON q.input_file_id = b.input_file_id AND q.custom_id = r.custom_id
    WHERE {column} {match}
) AS found
WHERE exchanges.id = found.exchange_id AND exchanges.request IS NULL
    AND NOT exchanges.request_omitted"""
"""Results (of these exchanges, files, or batches' input files) learn their request line."""
_LINKS = (
    (_LINK_BATCH, "exchange_id", "results"),
    (_LINK_BATCH, "file_id", "files"),
    (_LINK_REQUEST, "r.exchange_id", "results"),
    (_LINK_REQUEST, "r.file_id", "files"),
    (_LINK_REQUEST, "b.input_file_id", "files"),
)
"""Each statement matches one indexed column, so it reads only the rows it may change: the
results written now, and all results of the files an upload or a batch sighting names."""


def _sql(template: str, table: Any, mark: str) -> str:
    names = columns(table)
    marks = ", ".join(mark.format(n=n) for n in range(1, len(names) + 1))
    return template.format(columns=", ".join(names), marks=marks)


def _gathered(fresh: Sequence[Rows]) -> tuple[list[Row], list[Row], list[Rows]]:
    """The batch's input lines, batches and result bookings, each key once (the first), sorted
    by key: processes writing the same keys lock them in the same order, so they wait, not
    deadlock."""
    requests: dict[tuple[str, str], Row] = {}
    batches: dict[str, Row] = {}
    bookings: dict[str, Rows] = {}
    for rows in fresh:
        if rows.booking is not None:
            bookings.setdefault(rows.booking["line_id"], rows)
        if rows.batch is None:
            continue
        for row in rows.batch.requests:
            requests.setdefault((row["input_file_id"], row["custom_id"]), row)
        for row in rows.batch.batches:
            known = batches.get(row["id"])
            if known is None or row["seen_at"] >= known["seen_at"]:
                batches[row["id"]] = row
    return (
        [requests[k] for k in sorted(requests)],
        [batches[k] for k in sorted(batches)],
        [bookings[k] for k in sorted(bookings)],
    )


def _booked_only(fresh: Sequence[Rows], booked: list[Rows]) -> list[Rows]:
    """`fresh` without the result lines booked before (or twice in it)."""
    chosen = {id(rows) for rows in booked}
    return [rows for rows in fresh if rows.booking is None or id(rows) in chosen]


def _linked(fresh: Iterable[Rows]) -> dict[str, list[str]]:
    """What the batch's exchanges may link: the results written now, by exchange id, and the
    files uploads and batch sightings name."""
    results, files = set(), set()
    for rows in fresh:
        if rows.booking is not None:
            results.add(rows.id)
        elif rows.batch is not None:
            files.update(rows.batch.files)
    return {"results": sorted(results), "files": sorted(files)}


# --- PostgreSQL (asyncpg, inside the batch's transaction) ---


def _values(table: Any, rows: list[Row]) -> list[tuple[Any, ...]]:
    names = columns(table)
    return [tuple(row[name] for name in names) for row in rows]


async def book_pg(driver: asyncpg.Connection, fresh: Sequence[Rows]) -> list[Rows]:
    """Store what `fresh` says of batches; `fresh` without the results booked before."""
    requests, batches, bookings = _gathered(fresh)
    if requests:
        sql = _sql(_REQUESTS_INSERT, t.batch_requests, "${n}")
        await driver.executemany(sql, _values(t.batch_requests, requests))
    if batches:
        await driver.executemany(
            _sql(_BATCH_UPSERT, t.batches, "${n}"), _values(t.batches, batches)
        )
    if not bookings:
        return list(fresh)
    keys = [rows.booking for rows in bookings if rows.booking is not None]
    arrays = [[key[name] for key in keys] for name in columns(t.batch_results)]
    booked = {record[0] for record in await driver.fetch(_RESULTS_BOOK_PG, *arrays)}
    chosen = [rows for rows in bookings if rows.booking and rows.booking["line_id"] in booked]
    return _booked_only(fresh, chosen)


async def link_pg(driver: asyncpg.Connection, fresh: Sequence[Rows]) -> None:
    linked = _linked(fresh)
    for template, column, kind in _LINKS:
        if linked[kind]:
            sql = template.format(column=column, match="= ANY($1::varchar[])")
            await driver.execute(sql, linked[kind])


# --- SQLite (sqlite3, on the writer's connection, inside `BEGIN IMMEDIATE`) ---


def _sqlite_values(table: Any, rows: list[Row]) -> list[tuple[Any, ...]]:
    names = columns(table)
    return [tuple(_sqlite(row[name]) for name in names) for row in rows]


def _sqlite(value: Any) -> Any:
    """A time as the SQLite writer stores one (`sqlite_writer.sqlite_time`): UTC wall clock
    with microseconds, text that sorts and compares as time."""
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat(" ", "microseconds")[:26]
    return value


def book_sqlite(con: sqlite3.Connection, fresh: Sequence[Rows]) -> list[Rows]:
    """As `book_pg`; the write lock this transaction holds makes the check and the insert one
    step for every other writer."""
    requests, batches, bookings = _gathered(fresh)
    if requests:
        sql = _sql(_REQUESTS_INSERT, t.batch_requests, "?")
        con.executemany(sql, _sqlite_values(t.batch_requests, requests))
    if batches:
        con.executemany(_sql(_BATCH_UPSERT, t.batches, "?"), _sqlite_values(t.batches, batches))
    keys = [rows.booking for rows in bookings if rows.booking is not None]
    if not keys:
        return list(fresh)
    known: set[str] = set()
    for marks, part in in_lists([key["line_id"] for key in keys]):
        found = con.execute(f"SELECT line_id FROM batch_results WHERE line_id IN ({marks})", part)
        known.update(row[0] for row in found)
    chosen = [rows for rows in bookings if rows.booking and rows.booking["line_id"] not in known]
    if chosen:
        sql = _sql("INSERT INTO batch_results ({columns}) VALUES ({marks})", t.batch_results, "?")
        booked = [rows.booking for rows in chosen if rows.booking is not None]
        con.executemany(sql, _sqlite_values(t.batch_results, booked))
    return _booked_only(fresh, chosen)


def link_sqlite(con: sqlite3.Connection, fresh: Sequence[Rows]) -> None:
    linked = _linked(fresh)
    for template, column, kind in _LINKS:
        for marks, part in in_lists(linked[kind]):
            con.execute(template.format(column=column, match=f"IN ({marks})"), part)
