"""Reading many exchanges without holding them: the queries behind `replay`, `playback` and
`export`.

`select_ids` picks exchanges by the same filters as `logs` (plus `until`). `stream_records`
yields full records oldest first, `batch` rows at a time from a server-side cursor (asyncpg)
or a stepped SQLite cursor, so an export of millions of rows holds one batch in memory.
`stream_requests` walks the stored requests that playback can answer, and `get_recorded`
reads back what one exchange's client received.
"""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.store import tables as t
from proxy.store.engine import StoreError, dumps
from proxy.store.filters import Filters
from proxy.store.read import _tags, exchange_record, usage_columns

BATCH = 500


async def select_ids(engine: AsyncEngine, filters: Filters) -> list[str]:
    """Ids of the newest `filters.limit` matching exchanges, oldest first."""
    ex = t.exchanges
    query = (
        sa.select(ex.c.id).where(*filters.where()).order_by(ex.c.started_at.desc(), ex.c.id.desc())
    )
    if filters.limit is not None:
        query = query.limit(filters.limit)
    async with engine.connect() as conn:
        ids = list((await conn.execute(query)).scalars())
    return ids[::-1]


async def stream_records(
    engine: AsyncEngine, filters: Filters, *, raw_streams: bool = False, batch: int = BATCH
) -> AsyncIterator[dict[str, Any]]:
    """Full `show --json` records, oldest first; with `raw_streams`, each also carries
    `raw_stream`: the bytes a stream's client received (None when not kept)."""
    ex, usage, raw = t.exchanges, t.usage, t.raw_streams
    columns: list[Any] = [ex, *usage_columns()]
    joined = ex.outerjoin(usage, usage.c.exchange_id == ex.c.id)
    if raw_streams:
        columns.append(raw.c.gz.label("raw_gz"))
        joined = joined.outerjoin(raw, raw.c.exchange_id == ex.c.id)
    query = (
        sa.select(*columns)
        .select_from(joined)
        .where(*filters.where())
        .order_by(ex.c.started_at, ex.c.id)
    )
    if filters.limit is not None:
        query = query.limit(filters.limit)
    async with engine.connect() as conn:
        result = await conn.stream(query.execution_options(yield_per=batch))
        async for rows in result.mappings().partitions():
            tags = await _tags(conn, [row["id"] for row in rows])
            for row in rows:
                record = exchange_record(row, row, tags[row["id"]])
                if raw_streams:
                    gz = row["raw_gz"]
                    record["raw_stream"] = None if gz is None else gzip.decompress(gz)
                yield record


@dataclass(frozen=True, slots=True)
class StoredRequest:
    id: str
    method: str
    path: str
    query: str
    upstream: str
    stream: bool
    body: Any
    """The request JSON; None for a request without a body."""


async def stream_requests(
    engine: AsyncEngine, batch: int = BATCH, *, errors: bool = False
) -> AsyncIterator[StoredRequest]:
    """The requests of every exchange playback can answer, oldest first: it succeeded (or,
    with `errors`, the upstream answered it with an error status: a 429, a 500), its request
    and response were kept, its request was JSON or empty, and a stream's exact bytes were
    kept."""
    ex, raw = t.exchanges, t.raw_streams
    has_raw = sa.exists().where(raw.c.exchange_id == ex.c.id)
    answered = sa.and_(ex.c.outcome == "ok", ex.c.status < 400)
    if errors:
        failed = sa.and_(ex.c.outcome == "upstream_error", ex.c.status >= 400)
        answered = sa.or_(answered, failed)
    query = (
        sa.select(
            ex.c.id,
            ex.c.method,
            ex.c.path,
            ex.c.query,
            ex.c.upstream,
            ex.c.stream,
            ex.c.request,
            ex.c.request_body,
        )
        .where(
            answered,
            ex.c.request_omitted.is_(False),
            ex.c.response_omitted.is_(False),
            sa.or_(ex.c.stream.is_(False), has_raw),
        )
        .order_by(ex.c.started_at, ex.c.id)
    )
    async with engine.connect() as conn:
        result = await conn.stream(query.execution_options(yield_per=batch))
        async for row in result:
            if row.request is None and row.request_body:
                continue  # a body that is not JSON (an upload): nothing canonical to match
            yield StoredRequest(
                row.id, row.method, row.path, row.query, row.upstream, row.stream, row.request
            )


@dataclass(frozen=True, slots=True)
class Recorded:
    """What one exchange's client received."""

    id: str
    status: int
    content_type: str | None
    body: bytes
    """A non-stream's body: the stored bytes, else the stored JSON serialised again."""
    raw_stream: bytes | None
    pacing: list[tuple[int, float]]
    duration_ms: float | None


async def get_recorded(engine: AsyncEngine, exchange_id: str) -> Recorded:
    ex, raw = t.exchanges, t.raw_streams
    query = (
        sa.select(
            ex.c.id,
            ex.c.status,
            ex.c.content_type,
            ex.c.response,
            ex.c.response_body,
            ex.c.duration_ms,
            raw.c.gz,
            raw.c.pacing,
        )
        .select_from(ex.outerjoin(raw, raw.c.exchange_id == ex.c.id))
        .where(ex.c.id == exchange_id)
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query)).first()
    if row is None:
        raise StoreError(f"no exchange with id {exchange_id!r}")
    if row.response_body is not None:
        body = bytes(row.response_body)
    elif row.response is not None:
        body = dumps(row.response).encode()
    else:
        body = b""
    return Recorded(
        id=row.id,
        status=row.status or 200,
        content_type=row.content_type,
        body=body,
        raw_stream=None if row.gz is None else gzip.decompress(row.gz),
        pacing=[(int(offset), float(ms)) for offset, ms in row.pacing or []],
        duration_ms=row.duration_ms,
    )
