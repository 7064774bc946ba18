"""Rows back into exchanges: the queries behind `logs` and `show`, and how they print.

`get_exchange` returns the `show --json` object (SPEC section 6): the stored request and
response JSON, usage as the upstream reported it, and the exchange's metadata and timings.
`browse.list_exchanges` returns one summary per exchange, newest first, for `logs`.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from proxy.store import tables as t
from proxy.store.engine import StoreError, check_connection, create_engine, describe
from proxy.store.migrate import check_head
from proxy.text import printable

_RELATIVE = re.compile(r"^(\d+)\s*(s|m|h|d|w)$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def require_sqlite_file(url: str) -> None:
    """Connecting would create an empty SQLite file: say the path is wrong instead."""
    try:
        parsed = make_url(url)
    except sa.exc.ArgumentError:
        return  # create_engine names the problem
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database in ("", ":memory:"):
        return
    if not database.startswith("file:") and not Path(database).is_file():
        raise StoreError(f"no database file at {database}")


@contextlib.asynccontextmanager
async def reading(url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on an existing, migrated database; every failure is one `StoreError` line."""
    require_sqlite_file(url)
    engine = create_engine(url)
    try:
        await check_readable(engine)
        yield engine
    except sa.exc.SQLAlchemyError as exc:
        raise StoreError(f"reading the database failed: {describe(exc)}") from None
    finally:
        await engine.dispose()


async def check_readable(engine: AsyncEngine) -> None:
    """Raise `StoreError` unless the database answers and its schema is at head."""
    try:
        await check_connection(engine)
        await check_head(engine)
    except sa.exc.SQLAlchemyError as exc:  # lost between the two
        raise StoreError(f"reading the database failed: {describe(exc)}") from None


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """`15m`, `2h`, `7d`, `1w` ago, or an ISO-8601 date/time (local time when it has no zone)."""
    found = _RELATIVE.match(text.strip())
    try:
        if found:
            delta = timedelta(**{_UNITS[found[2]]: int(found[1])})
            return (now or datetime.now(UTC)) - delta
        when = datetime.fromisoformat(text.strip())
        return when.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{text!r} is out of range (years 1 to 9999 only)") from None
    except ValueError:
        raise ValueError(
            f"expected a duration like 15m, 2h, 7d or an ISO date/time, got {text!r}"
        ) from None


def parse_tag(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected key=value, got {text!r}")
    return key.strip().lower(), value


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    # SQLite hands back naive datetimes; everything is stored in UTC.
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).isoformat()


async def _tags(conn: AsyncConnection, ids: list[str]) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {id_: {} for id_ in ids}
    if ids:
        query = sa.select(t.tags).where(t.tags.c.exchange_id.in_(ids))
        for row in await conn.execute(query):
            found[row.exchange_id][row.key] = row.value
    return found


def _body(parsed: Any, raw: bytes | None, omitted: bool) -> Any:
    if omitted or parsed is not None or raw is None:
        return parsed
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(raw).decode("ascii")}


async def get_exchange(engine: AsyncEngine, exchange_id: str) -> dict[str, Any]:
    """The `show --json` object; `StoreError` when no exchange has this id (or id prefix)."""
    ex = t.exchanges
    async with engine.connect() as conn:
        row = (await conn.execute(sa.select(ex).where(ex.c.id == exchange_id))).mappings().first()
        if row is None and len(exchange_id) >= 8:
            query = sa.select(ex).where(ex.c.id.startswith(exchange_id, autoescape=True)).limit(2)
            matches = (await conn.execute(query)).mappings().all()
            if len(matches) > 1:
                raise StoreError(f"exchange id prefix {exchange_id!r} is ambiguous")
            row = matches[0] if matches else None
        if row is None:
            raise StoreError(f"no exchange with id {exchange_id!r}")
        query = sa.select(*usage_columns()).where(t.usage.c.exchange_id == row["id"])
        usage = (await conn.execute(query)).mappings().first()
        tags = (await _tags(conn, [row["id"]]))[row["id"]]
    return exchange_record(row, usage, tags)


TOKEN_COLUMNS = (
    "prompt_tokens",
    "cached_tokens",
    "cache_write_tokens",
    "prompt_audio_tokens",
    "cached_audio_tokens",
    "prompt_image_tokens",
    "cached_image_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "completion_audio_tokens",
    "completion_image_tokens",
    "total_tokens",
)
"""The decoded usage columns `show` gives as `tokens` (each without `_tokens`)."""


def usage_columns() -> list[Any]:
    """The `usage` columns `exchange_record` reads, labelled `usage_<column>`."""
    return [t.usage.c[name].label(f"usage_{name}") for name in ("raw", *TOKEN_COLUMNS)]


def _tokens(usage: Any) -> dict[str, int | None] | None:
    """The usage as decoded when the exchange completed (`proxy.usage`), by class."""
    if usage is None or usage["usage_raw"] is None:
        return None
    return {name.removesuffix("_tokens"): usage[f"usage_{name}"] for name in TOKEN_COLUMNS}


def exchange_record(row: Any, usage: Any, tags: dict[str, str]) -> dict[str, Any]:
    """The `show --json` object from an `exchanges` row (a mapping), its `usage_columns`
    (a mapping, or None) and tags; `export --format jsonl` writes the same object."""
    return {
        "id": row["id"],
        "started_at": _iso(row["started_at"]),
        "method": row["method"],
        "path": row["path"],
        "query": row["query"],
        "upstream": row["upstream"],
        "upstream_url": row["upstream_url"],
        "status": row["status"],
        "outcome": row["outcome"],
        "error": row["error"],
        "stream": row["stream"],
        "model": row["model"],
        "response_model": row["response_model"],
        "request": _body(row["request"], row["request_body"], row["request_omitted"]),
        "response": _body(row["response"], row["response_body"], row["response_omitted"]),
        "request_omitted": row["request_omitted"],
        "response_omitted": row["response_omitted"],
        "content_type": row["content_type"],
        "response_bytes": row["response_bytes"],
        "usage": None if usage is None else usage["usage_raw"],
        "tokens": _tokens(usage),
        "usage_source": row["usage_source"],
        "service_tier": row["service_tier"],
        "cost_usd": row["cost_usd"],
        "price_entry": row["price_entry"],
        "tags": tags,
        "user": row["end_user"],
        "key_hint": row["key_hint"],
        "key_hash": row["key_hash"],
        "replay_of": row["replay_of"],
        "session": row["session"],
        "ttfb_ms": row["ttfb_ms"],
        "ttft_ms": row["ttft_ms"],
        "duration_ms": row["duration_ms"],
        "chunks": row["chunks"],
        "upstream_request_id": row["upstream_request_id"],
        "system_fingerprint": row["system_fingerprint"],
        "parse_errors": row["parse_errors"] or [],
        "redacted": row["redacted"],
    }


async def get_raw_stream(
    engine: AsyncEngine, exchange_id: str
) -> tuple[bytes, list[tuple[int, float]]] | None:
    """The exact bytes a stream's client received and when (offset, ms), for playback."""
    query = sa.select(t.raw_streams).where(t.raw_streams.c.exchange_id == exchange_id)
    async with engine.connect() as conn:
        row = (await conn.execute(query)).first()
    if row is None:
        return None
    pacing = [(int(offset), float(ms)) for offset, ms in row.pacing or []]
    return gzip.decompress(row.gz), pacing


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _utc(iso: str | None) -> str:
    """A stored time in UTC, as the console shows times (`--since` takes any zone)."""
    return "-" if iso is None else datetime.fromisoformat(iso).astimezone(UTC).strftime("%F %T")


def render_table(summaries: list[dict[str, Any]]) -> str:
    """`logs` as aligned columns; times in UTC, as the header says."""
    header = ("STARTED (UTC)", "ID", "MODEL", "STATUS", "OUTCOME", "TOKENS", "MS", "USER", "TAGS")
    lines: list[tuple[str, ...]] = [header]
    for s in summaries:
        tokens = "-"
        if s["prompt_tokens"] is not None or s["completion_tokens"] is not None:
            tokens = f"{s['prompt_tokens'] or 0}/{s['completion_tokens'] or 0}"
        lines.append(
            (
                _utc(s["started_at"]),
                s["id"],
                s["response_model"] or s["model"] or "-",  # the one model name
                "-" if s["status"] is None else str(s["status"]),
                s["outcome"] + (" stream" if s["stream"] else ""),
                tokens,
                _ms(s["duration_ms"]),
                s["user"] or "-",
                ",".join(f"{k}={v}" for k, v in s["tags"].items()) or "-",
            )
        )
    lines = [tuple(printable(cell, cell=True) for cell in line) for line in lines]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def _pretty(value: Any) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


def _count(value: Any) -> str:
    return "-" if value is None else str(value)


def _cost(shown: dict[str, Any]) -> str:
    """The cost and where its price came from; "unpriced" for usage no price covers."""
    if shown["cost_usd"] is None:
        return "unpriced" if shown["usage"] is not None else "-"
    return f"${shown['cost_usd']:.9f} ({shown['price_entry']})"


def render_exchange(shown: dict[str, Any]) -> str:
    """`show` for people: a header of facts, then the request and response bodies."""
    tokens = shown["tokens"] or {}
    facts = [
        ("id", shown["id"]),
        ("started", f"{_utc(shown['started_at'])} UTC ({shown['started_at']})"),
        ("request", f"{shown['method']} {shown['path']} -> {shown['upstream']}"),
        (
            "status",
            f"{shown['status']} {shown['outcome']}" + (" (stream)" if shown["stream"] else ""),
        ),
        ("model", f"{shown['model']} -> {shown['response_model']}"),
        (
            "usage",
            f"{_count(tokens.get('prompt'))} prompt ({_count(tokens.get('cached'))} cached), "
            f"{_count(tokens.get('completion'))} completion "
            f"({_count(tokens.get('reasoning'))} reasoning) ({shown['usage_source']})",
        ),
        (
            "timings",
            f"ttfb {_ms(shown['ttfb_ms'])} ms, ttft {_ms(shown['ttft_ms'])} ms, "
            f"total {_ms(shown['duration_ms'])} ms, {shown['chunks']} chunks",
        ),
        ("cost", _cost(shown)),
        ("tier", shown["service_tier"]),
        ("user", shown["user"]),
        ("key", shown["key_hint"]),
        ("tags", ", ".join(f"{k}={v}" for k, v in shown["tags"].items()) or None),
        ("fingerprint", shown["system_fingerprint"]),
        ("upstream id", shown["upstream_request_id"]),
        ("replay of", shown["replay_of"]),
        ("error", shown["error"]),
        ("redacted", _redacted(shown["redacted"])),
    ]
    out = [f"{name:<12} {value}" for name, value in facts if value is not None]
    for name in ("request", "response"):
        body = "(omitted)" if shown[f"{name}_omitted"] else _pretty(shown[name])
        out += ["", f"--- {name} ---", body]
    return printable("\n".join(out))


def _redacted(note: Any) -> str | None:
    """`show`'s line for the `redacted` note: the rules that matched, what was not kept."""
    if not isinstance(note, dict):
        return None
    text = ", ".join(str(rule) for rule in note.get("rules") or ()) or "(failed)"
    dropped = note.get("dropped")
    return f"{text}; not kept: {', '.join(dropped)}" if dropped else text
