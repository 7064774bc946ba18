"""Exchanges into rows: one transaction per batch, bulk inserts, idempotent by exchange id.

A batch first asks which of its exchange ids are stored already; the exchange and child rows
(tags, completions, choices, usage, logprobs, raw streams) and the fingerprint counts are
written only for the others, so a batch replayed after an unknown commit outcome, or a spool
drained twice, never writes anything twice. Row building tolerates any JSON shape: a vendor's
odd response loses its projection rows, never its record.

Row building also prices the exchange (`cost_for`): the background writer does it, in short
steps between the relay's turns, never inside a request; `flightrec cost --reprice` uses the
same function on stored rows.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from itertools import chain
from typing import Any, NamedTuple

import asyncpg  # type: ignore[import-untyped]
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from ..exchange import Exchange
from ..pricing import Price, PriceTable
from . import tables as t
from .engine import dumps

Row = dict[str, Any]
_INT32 = 2**31
_INT64 = 2**63


class Bodies(NamedTuple):
    """What is kept of the bodies: JSON when they parse, raw bytes otherwise, nothing if omitted."""

    request: Any
    request_body: bytes | None
    response: Any
    response_body: bytes | None
    raw_stream_gz: bytes | None


def stored_bodies(ex: Exchange) -> Bodies:
    request, request_body = (None, None)
    if not ex.omit_request:
        request = ex.request_json
        request_body = ex.request_body if request is None else None
    response, response_body, raw_stream_gz = (None, None, None)
    if not ex.omit_response:
        response = ex.response_json
        response_body = ex.response_body if response is None else None
        raw_stream_gz = ex.raw_stream_gz
    return Bodies(request, request_body, response, response_body, raw_stream_gz)


Record = tuple[Any, ...]
"""A row as the drivers take it: the table's column values in column order, JSON as text."""


@dataclass(slots=True)
class Rows:
    """One exchange's rows, ready for the drivers. Built as tuples, not dicts: turning dicts
    into the drivers' tuples cost the recorder more than building them (bench/). Times stay
    datetimes (`exchanges.started_at`, `fingerprint`): SQLite stores them as text,
    PostgreSQL as timestamptz."""

    exchange: Record
    tags: list[Record] = field(default_factory=list)
    completions: list[Record] = field(default_factory=list)
    choices: list[Record] = field(default_factory=list)
    usage: list[Record] = field(default_factory=list)
    logprobs: list[Record] = field(default_factory=list)
    raw_streams: list[Record] = field(default_factory=list)
    fingerprint: Row | None = None

    @property
    def id(self) -> str:
        """The exchange's id: the first column of its row."""
        return str(self.exchange[0])


def _int(value: Any, limit: int = _INT32) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and -limit <= value < limit:
        return value
    return None


def _text(value: Any) -> str | None:
    """A string for a text column. PostgreSQL text cannot hold NUL; the JSON copy keeps it."""
    if not isinstance(value, str):
        return None
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


@cache
def shipped_prices() -> PriceTable:
    """The price table as shipped, for callers that have no config."""
    return PriceTable.load()


def price_entry(price: Price) -> str:
    """What `exchanges.price_entry` holds: the key and where its rates came from."""
    return f"{price.key} ({price.source})"


def cost_for(
    prices: PriceTable, model: str | None, response_model: str | None, usage: Any
) -> tuple[float | None, str | None]:
    """(`cost_usd`, `price_entry`) of one exchange; (None, None) when it cannot be priced.

    The model that answered (`response_model`) is priced; the requested one only when the
    response names none. A response model the table does not know stays unpriced rather than
    being billed at the rates of the model that was asked for.
    """
    cost, price = prices.cost(response_model or model, usage)
    if cost is None or price is None:
        return None, None
    return cost, price_entry(price)


def _json(value: Any) -> str | None:
    """A JSON column's text; None stays SQL NULL."""
    return None if value is None else dumps(value)


def _body_json(parsed: Any, raw: bytes | None) -> str | None:
    """A body's JSON column: the text it was parsed from when there is one (what was sent,
    key order and spacing kept, and nothing serialised again), else the value serialised."""
    if parsed is None:
        return None
    if raw is not None:
        try:
            return raw.decode()
        except UnicodeDecodeError:  # cannot be what a JSON parser accepted: not its source
            pass
    return dumps(parsed)


def rows_for(ex: Exchange, prices: PriceTable | None = None) -> Rows:
    """The rows of one exchange, priced with `prices` (default: the shipped table).

    Each tuple lists its table's columns in `tables.py` order (tests/test_store.py reads every
    column back by name)."""
    bodies = stored_bodies(ex)
    started = datetime.fromtimestamp(ex.started_at, UTC)
    response = _dict(ex.response_json)
    fingerprint = _text(ex.system_fingerprint) or _text(response.get("system_fingerprint"))
    response_model = _text(ex.response_model) or _text(response.get("model"))
    usage = ex.usage if isinstance(ex.usage, dict) else _dict(response.get("usage")) or None
    model = _text(ex.model)
    upstream = _text(ex.upstream) or ""
    cost, entry = cost_for(prices or shipped_prices(), model, response_model, usage)
    exchange_id = ex.id
    rows = Rows(
        (
            exchange_id,
            started,
            _text(ex.method) or "",
            _text(ex.path) or "",
            _text(ex.query) or "",
            upstream,
            _text(ex.upstream_url) or "",
            _int(ex.status),
            bool(ex.stream),
            model,
            response_model,
            _text(ex.outcome) or "ok",
            _text(ex.error),
            _body_json(bodies.request, ex.request_body),
            bodies.request_body,
            ex.omit_request,
            _body_json(bodies.response, ex.response_body),
            bodies.response_body,
            ex.omit_response,
            _int(ex.response_bytes, _INT64) or 0,
            _text(ex.content_type),
            _float(ex.ttfb_ms),
            _float(ex.ttft_ms),
            _float(ex.duration_ms),
            _int(ex.chunks) or 0,
            _text(ex.upstream_request_id),
            _text(ex.key_hash),
            _text(ex.key_hint),
            _text(ex.user),
            _text(ex.replay_of),
            _text(ex.usage_source),
            fingerprint,
            _json(list(ex.parse_errors) or None),
            cost,
            entry,
        ),
    )
    if ex.tags:
        rows.tags = [
            (exchange_id, _text(key), _text(value) or "")
            for key, value in ex.tags.items()
            if isinstance(key, str)
        ]
    if usage is not None:
        rows.usage.append(usage_row(exchange_id, usage))
    # Choices and logprobs are the response's content: an omitted response has none of them.
    if _is_chat_completion(response) and not ex.omit_response:
        _completion_rows(exchange_id, response, rows)
    if bodies.raw_stream_gz is not None:
        pacing = ex.raw_pacing
        rows.raw_streams.append(
            (
                exchange_id,
                bodies.raw_stream_gz,
                _json([list(p) for p in pacing] if isinstance(pacing, list) else None),
            )
        )
    if fingerprint is not None:
        rows.fingerprint = {
            "upstream": upstream,
            "model": response_model or model or "",
            "system_fingerprint": fingerprint,
            "first_seen": started,
            "last_seen": started,
            "count": 1,
        }
    return rows


def usage_row(exchange_id: str, usage: dict[str, Any]) -> Record:
    """Every usage detail as a column; Chat Completions and Responses API names both map."""
    prompt = _dict(usage.get("prompt_tokens_details")) or _dict(usage.get("input_tokens_details"))
    completion = _dict(usage.get("completion_tokens_details")) or _dict(
        usage.get("output_tokens_details")
    )
    prompt_tokens = _int(usage.get("prompt_tokens"))
    completion_tokens = _int(usage.get("completion_tokens"))
    return (
        exchange_id,
        _int(usage.get("input_tokens")) if prompt_tokens is None else prompt_tokens,
        _int(usage.get("output_tokens")) if completion_tokens is None else completion_tokens,
        _int(usage.get("total_tokens")),
        _int(prompt.get("cached_tokens")),
        _int(prompt.get("audio_tokens")),
        _int(completion.get("reasoning_tokens")),
        _int(completion.get("audio_tokens")),
        _int(completion.get("accepted_prediction_tokens")),
        _int(completion.get("rejected_prediction_tokens")),
        dumps(usage),
    )


def _is_chat_completion(response: dict[str, Any]) -> bool:
    if response.get("object") == "chat.completion":
        return True
    found = response.get("choices")
    return isinstance(found, list) and any("message" in _dict(c) for c in found)


def _completion_rows(exchange_id: str, response: dict[str, Any], rows: Rows) -> None:
    rows.completions.append(
        (
            exchange_id,
            _text(response.get("id")),
            _text(response.get("object")),
            _int(response.get("created"), _INT64),
            _text(response.get("model")),
            _text(response.get("system_fingerprint")),
            _text(response.get("service_tier")),
        )
    )
    found = response.get("choices")
    seen: set[int] = set()
    for position, raw in enumerate(found if isinstance(found, list) else []):
        choice = _dict(raw)
        index = _int(choice.get("index"))
        index = position if index is None or index in seen else index
        seen.add(index)
        message = _dict(choice.get("message"))
        rows.choices.append(
            (
                exchange_id,
                index,
                _text(message.get("role")),
                _text(message.get("content")),
                _text(message.get("refusal")),
                _text(choice.get("finish_reason")),
                _json(message.get("tool_calls")),
                _json(message.get("function_call")),
                _json(message.get("audio")),
            )
        )
        logprobs = _dict(choice.get("logprobs"))
        for kind in ("content", "refusal"):
            tokens = logprobs.get(kind)
            if isinstance(tokens, list):
                rows.logprobs.extend(_logprob_rows(exchange_id, index, kind, tokens))


def _logprob_rows(exchange_id: str, index: int, kind: str, tokens: list[Any]) -> Iterable[Record]:
    for position, raw in enumerate(tokens):
        token = _dict(raw)
        found_bytes = token.get("bytes")
        found_top = token.get("top_logprobs")
        yield (
            exchange_id,
            index,
            kind,
            position,
            _text(token.get("token")) or "",
            _float(token.get("logprob")),
            dumps(found_bytes) if isinstance(found_bytes, list) else None,
            dumps(found_top) if isinstance(found_top, list) else None,
        )


def unique(batch: Sequence[Rows]) -> dict[str, Rows]:
    """The batch by exchange id, each id once (the first occurrence wins)."""
    by_id: dict[str, Rows] = {}
    for rows in batch:
        by_id.setdefault(rows.id, rows)
    return by_id


_CHILDREN = (
    (t.tags, "tags"),
    (t.completions, "completions"),
    (t.choices, "choices"),
    (t.usage, "usage"),
    (t.logprobs, "logprobs"),
    (t.raw_streams, "raw_streams"),
)


def table_rows(fresh: Sequence[Rows]) -> Iterator[tuple[sa.Table, list[Record]]]:
    """(table, records) to insert for exchanges not stored yet, parents first, none empty."""
    if fresh:
        yield t.exchanges, [rows.exchange for rows in fresh]
    for table, attr in _CHILDREN:
        children = [row for rows in fresh for row in getattr(rows, attr)]
        if children:
            yield table, children


async def write_rows(conn: AsyncConnection, batch: Sequence[Rows]) -> int:
    """Write a batch inside the caller's transaction; returns how many exchanges were new.

    The recorder writes SQLite through `store.sqlite_writer` (same rows, same statements, on
    the event loop's thread); this is the path for PostgreSQL and for any async connection.
    """
    by_id = unique(batch)
    if not by_id:
        return 0
    if conn.dialect.name == "postgresql":
        # One array parameter: an IN list is rendered anew, a placeholder per id, each batch.
        # Through SQLAlchemy's driver path, not asyncpg's: its first statement is what opens
        # the transaction that the raw COPYs and the upsert after it then run in.
        found = await conn.exec_driver_sql(PG_STORED_IDS, (list(by_id),))
        stored = set(found.scalars())
    else:
        known = await conn.execute(sa.select(t.exchanges.c.id).where(t.exchanges.c.id.in_(by_id)))
        stored = set(known.scalars())
    fresh = [rows for exchange_id, rows in by_id.items() if exchange_id not in stored]
    for table, rows in table_rows(fresh):
        await _bulk_insert(conn, table, rows)
    await _count_fingerprints(conn, [rows.fingerprint for rows in fresh if rows.fingerprint])
    return len(fresh)


def _sqlite_time(value: datetime) -> str:
    """A time as SQLAlchemy's SQLite DateTime stores it (UTC wall clock, always with
    microseconds: "2024-05-01 12:00:00.000000"), so reads parse it back."""
    if value.tzinfo is not UTC:
        value = value.astimezone(UTC)
    # `isoformat` is several times cheaper than the equivalent `strftime`; [:26] cuts "+00:00".
    return value.isoformat(" ", "microseconds")[:26]


class _Layout(NamedTuple):
    columns: list[str]
    convert_at: list[tuple[int, Callable[[Any], Any]]]
    """(position, converter) of the columns SQLite gets in another type than the rows hold:
    times as text, booleans as 0 and 1 (`sqlite_inserts`)."""
    insert: str
    """`INSERT INTO "table" ("a", "b", ...) VALUES ` for SQLite; row placeholders follow."""
    row: str
    """One row's placeholders: `(?, ?, ...)`."""


@cache
def _layout(table: sa.Table) -> _Layout:
    """Columns, time column positions, and the SQLite INSERT of a table, made once."""
    columns = [column.name for column in table.columns]
    names = ", ".join(f'"{name}"' for name in columns)
    return _Layout(
        columns=columns,
        convert_at=[
            (i, _sqlite_time if isinstance(c.type, sa.DateTime) else int)
            for i, c in enumerate(table.columns)
            if isinstance(c.type, sa.DateTime | sa.Boolean)
        ],
        insert=f'INSERT INTO "{table.name}" ({names}) VALUES ',
        row="(" + ", ".join("?" * len(columns)) + ")",
    )


async def _bulk_insert(conn: AsyncConnection, table: sa.Table, records: list[Record]) -> None:
    """Records into a table at driver level: COPY on PostgreSQL, multi-row INSERTs on SQLite.

    Only exchanges not yet stored get here (checked in the same transaction; a process writes
    its own exchanges one batch at a time), so no ON CONFLICT is needed. SQLAlchemy's general
    execution path processed every parameter of every row in Python on the event loop's
    thread, which cost more than SQLite's own work (bench/bench_record.py, bench/).
    """
    if conn.dialect.name == "postgresql":
        driver = await _driver(conn)
        columns = _layout(table).columns
        with _refused_as_value_error():
            await driver.copy_records_to_table(table.name, records=records, columns=columns)
    else:
        for sql, params in sqlite_inserts(table, records):
            await conn.exec_driver_sql(sql, params)


def sqlite_inserts(table: sa.Table, records: list[Record]) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """(SQL, parameters) of the multi-row INSERTs that put `records` into `table` on SQLite.

    Every parameter is an exact str, int, float or bytes: Python 3.11's sqlite3 looks for an
    adapter for any other value, and for None and bool that costs a formatted AttributeError,
    raised and cleared (~220 ns a value against ~45 for an int; an exchange has ~19 of them,
    bench/). So None goes as `SQLITE_NULL` and booleans as 0 and 1, which is what SQLite
    stores for them anyway."""
    layout = _layout(table)
    null = sqlite_null()
    per = _sqlite_rows_per_insert(len(records[0]))
    for start in range(0, len(records), per):
        chunk = records[start : start + per]
        params: list[Any] = [null if v is None else v for v in chain.from_iterable(chunk)]
        width = len(chunk[0])
        for i, convert in layout.convert_at:
            for at in range(i, len(params), width):
                if params[at] is not null:
                    params[at] = convert(params[at])
        yield _sqlite_insert(table, len(chunk)), tuple(params)


SQLITE_NULL = float("nan")
"""Bound for NULL on SQLite: SQLite stores a NaN bound as a REAL as NULL (sqlite3_bind_double;
`sqlite_null` checks that the library here does)."""


@cache
def sqlite_null() -> float | None:
    """`SQLITE_NULL` if the SQLite library here stores it as NULL (SQLite's rule for a NaN),
    else None, which is NULL everywhere, only slower to bind."""
    with closing(sqlite3.connect(":memory:")) as con:
        stored_null = con.execute("SELECT ? IS NULL", (SQLITE_NULL,)).fetchone()[0]
    return SQLITE_NULL if stored_null else None


def _sqlite_rows_per_insert(width: int) -> int:
    # One multi-row INSERT per chunk, not executemany: sqlite3 gives up the GIL around every
    # statement step, and a step per row made the writer and the event loop trade the GIL
    # row by row. 32766 is SQLite's limit on bound parameters since 3.32.
    return max(1, min(500, 32_000 // width))


@cache
def _sqlite_insert(table: sa.Table, count: int) -> str:
    layout = _layout(table)
    return layout.insert + ", ".join([layout.row] * count)


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
        known["first_seen"] = min(known["first_seen"], row["first_seen"])
        known["last_seen"] = max(known["last_seen"], row["last_seen"])
    return [merged[key] for key in sorted(merged)]


SQLITE_COUNT_FINGERPRINTS = """\
INSERT INTO fingerprints (upstream, model, system_fingerprint, first_seen, last_seen, count)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (upstream, model, system_fingerprint) DO UPDATE SET
    count = count + excluded.count,
    first_seen = min(first_seen, excluded.first_seen),
    last_seen = max(last_seen, excluded.last_seen)"""
"""The fingerprint upsert on SQLite; times are text that sorts as time, so min/max work."""


PG_COUNT_FINGERPRINTS = """\
INSERT INTO fingerprints (upstream, model, system_fingerprint, first_seen, last_seen, count)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (upstream, model, system_fingerprint) DO UPDATE SET
    count = fingerprints.count + excluded.count,
    first_seen = least(fingerprints.first_seen, excluded.first_seen),
    last_seen = greatest(fingerprints.last_seen, excluded.last_seen)"""
"""The same upsert on PostgreSQL, sent as it is: SQLAlchemy compiled its construct anew for
every batch (with the id check's IN list, ~7 us an exchange of the batch's 15.8; a micro
harness on the bench's completion)."""
PG_STORED_IDS = "SELECT id FROM exchanges WHERE id = ANY($1::varchar[])"


def sqlite_fingerprint_params(rows: list[Row]) -> list[tuple[Any, ...]]:
    return [
        (
            row["upstream"],
            row["model"],
            row["system_fingerprint"],
            _sqlite_time(row["first_seen"]),
            _sqlite_time(row["last_seen"]),
            row["count"],
        )
        for row in rows
    ]


async def _count_fingerprints(conn: AsyncConnection, seen: list[Row]) -> None:
    merged = merged_fingerprints(seen)
    if not merged:
        return
    if conn.dialect.name != "postgresql":
        await conn.exec_driver_sql(SQLITE_COUNT_FINGERPRINTS, sqlite_fingerprint_params(merged))
        return
    driver = await _driver(conn)
    with _refused_as_value_error():
        await driver.executemany(
            PG_COUNT_FINGERPRINTS,
            [
                (
                    row["upstream"],
                    row["model"],
                    row["system_fingerprint"],
                    row["first_seen"],
                    row["last_seen"],
                    row["count"],
                )
                for row in merged
            ],
        )


@contextmanager
def _refused_as_value_error() -> Iterator[None]:
    """asyncpg's errors about the data, not the database, as the ValueError the recorder
    takes for a record to set aside (SQLAlchemy wraps them in its own DataError otherwise)."""
    try:
        yield
    except (asyncpg.DataError, asyncpg.IntegrityConstraintViolationError) as exc:
        raise ValueError(f"{type(exc).__name__}: {exc}") from exc


async def _driver(conn: AsyncConnection) -> asyncpg.Connection:
    """The asyncpg connection under `conn`, for statements of the transaction `conn` is in.

    SQLAlchemy opens that transaction with its first statement through its own driver path
    (`write_rows` asks which ids are stored that way); asyncpg calls made before it would each
    commit on their own, so that is checked here."""
    raw = await conn.get_raw_connection()
    driver: asyncpg.Connection = raw.driver_connection
    if not driver.is_in_transaction():
        raise RuntimeError("asyncpg used before the batch's transaction was opened")
    return driver
