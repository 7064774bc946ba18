"""Exchanges into rows: pure, no I/O. A child table's row is a dict keyed by its column names;
the exchange's own row is built straight as the drivers' tuple (`Record`, in `tables.exchanges`
order, read by index through `tables.EXCHANGE_AT`): its forty columns as a dict cost more
to build and to turn into that tuple than the rest of the row building (docs/performance.md).

`rows_for` builds every row of one exchange (the exchange, tags, completion, choices, usage,
logprobs, raw stream, fingerprint count) from the exchange's settled figures: its decoded
usage, cost and price entry (`proxy.sinks.settle`). Row building tolerates any JSON shape: a
vendor's odd response loses its projection rows, never its record. The writers
(`sqlite_writer`, `pg_writer`) take child rows by name; `store.records` turns a batch of them
into the drivers' tuples in the table's column order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any

from proxy.exchange import Exchange
from proxy.store import tables as t
from proxy.store.batch_rows import BatchRows, batch_rows, booking_row
from proxy.store.bodies import Bodies, stored_bodies
from proxy.store.completion_logprobs import completion_tokens
from proxy.store.engine import dumps
from proxy.store.logprob_rows import Record, logprob_records
from proxy.store.threads import keys
from proxy.usage import Usage

Row = dict[str, Any]
"""One row: column name to value; JSON columns as text, times as aware datetimes."""
_INT32 = 2**31
_INT64 = 2**63


@dataclass(slots=True)
class Rows:
    """One exchange's rows, by table."""

    exchange: Record
    """The `exchanges` row as the drivers take it: `tables.exchanges`' columns in order, times
    as aware datetimes (`exchange_fields` names them)."""
    tags: list[Row] = field(default_factory=list)
    completions: list[Row] = field(default_factory=list)
    choices: list[Row] = field(default_factory=list)
    usage: list[Row] = field(default_factory=list)
    logprobs: list[Record] = field(default_factory=list)
    """Already the drivers' tuples (`store.logprob_rows`): a row per token."""
    raw_streams: list[Row] = field(default_factory=list)
    fingerprint: Row | None = None
    """A `fingerprints` row counting this exchange once; the writers merge and upsert them."""
    batch: BatchRows | None = None
    """What the exchange says of Batch API files and batches (`batch_rows`)."""
    booking: Row | None = None
    """For a Batch API result line: its `batch_results` row; the exchange is written only
    when that row is new (`batch_sql`)."""

    @property
    def id(self) -> str:
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


_PLAIN = frozenset({str, type(None)})
_PAIRS = frozenset({tuple, list})
_FLOATS = frozenset({float, type(None)})


def _texts(found: tuple[Any, ...]) -> tuple[Any, ...]:
    """`_text` of each value; at once when all are plain strings (or None) without NUL, as a
    record's nearly always are."""
    if _PLAIN.issuperset(map(type, found)) and "\x00" not in "".join(filter(None, found)):
        return found
    return tuple(map(_text, found))


def _floats(found: tuple[Any, ...]) -> tuple[Any, ...]:
    """`_float` of each value; at once when all are floats or None."""
    return found if _FLOATS.issuperset(map(type, found)) else tuple(map(_float, found))


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


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


def rows_for(ex: Exchange) -> Rows:
    """The rows of one exchange, with the figures it was settled with; a Batch API result line
    with the row that books it."""
    rows = _rows(ex)
    line = ex.batch_line
    if line is None:
        rows.batch = batch_rows(ex)
    else:
        rows.booking = booking_row(ex.id, line)
    return rows


def _rows(ex: Exchange) -> Rows:
    response = _dict(ex.response_json)
    usage = ex.usage if isinstance(ex.usage, dict) else _dict(response.get("usage")) or None
    bodies = stored_bodies(ex)
    rows = Rows(_exchange_row(ex, response, bodies))
    exchange_id = ex.id
    if ex.tags:
        rows.tags = [
            {"exchange_id": exchange_id, "key": _text(key), "value": _text(value) or ""}
            for key, value in ex.tags.items()
            if isinstance(key, str)
        ]
    if usage is not None:
        rows.usage.append(usage_row(exchange_id, usage, ex.tokens))
    # Choices and logprobs are the response's content: an omitted response has none of them.
    if _is_chat_completion(response) and not ex.omit_response:
        _completion_rows(exchange_id, response, rows)
    elif response.get("object") == "text_completion" and not ex.omit_response:
        for index, tokens in completion_tokens(response):
            rows.logprobs.extend(logprob_records(exchange_id, index, "content", tokens))
    gz = bodies.raw_stream_gz
    if gz is not None:
        pacing = ex.raw_pacing
        if not isinstance(pacing, list):
            pacing_json = None
        elif _PAIRS.issuperset(map(type, pacing)):  # JSON writes a tuple as it writes a list
            pacing_json = dumps(pacing)
        else:
            pacing_json = dumps([list(p) for p in pacing])
        rows.raw_streams.append({"exchange_id": exchange_id, "gz": gz, "pacing": pacing_json})
    row = rows.exchange
    if row[_FINGERPRINT] is not None:
        rows.fingerprint = {
            "upstream": row[_UPSTREAM],
            "model": row[_RESPONSE_MODEL] or row[_MODEL] or "",
            "system_fingerprint": row[_FINGERPRINT],
            "first_seen": row[_STARTED_AT],
            "last_seen": row[_STARTED_AT],
            "count": 1,
        }
    return rows


_UPSTREAM, _MODEL, _RESPONSE_MODEL, _FINGERPRINT, _STARTED_AT = (
    t.EXCHANGE_AT[name]
    for name in ("upstream", "model", "response_model", "system_fingerprint", "started_at")
)
_COLUMNS = tuple(t.EXCHANGE_AT)


def exchange_fields(record: Record) -> Row:
    """An `exchanges` record (`Rows.exchange`) by column name."""
    return dict(zip(_COLUMNS, record, strict=True))


_EXCHANGE_TEXTS = attrgetter(
    *("method", "path", "query", "upstream", "upstream_url", "model", "response_model"),
    *("outcome", "error", "content_type", "upstream_request_id", "key_hash", "key_hint"),
    *("user", "replay_of", "usage_source", "system_fingerprint", "price_entry", "session"),
    "service_tier",
)
_EXCHANGE_FLOATS = attrgetter("ttfb_ms", "ttft_ms", "duration_ms", "cost_usd")


def _exchange_row(ex: Exchange, response: dict[str, Any], bodies: Bodies) -> Record:
    """The `exchanges` record in `tables.exchanges`' column order (tests/store checks it)."""
    texts = _texts(_EXCHANGE_TEXTS(ex))
    method, path, query, upstream, upstream_url, model, response_model = texts[:7]
    outcome, error, content_type, upstream_request_id, key_hash, key_hint = texts[7:13]
    user, replay_of, usage_source, system_fingerprint, price_entry, session = texts[13:19]
    service_tier = texts[19]
    ttfb_ms, ttft_ms, duration_ms, cost_usd = _floats(_EXCHANGE_FLOATS(ex))
    turn_key, parent_key = keys(ex.request_json, response)
    status: int | None = ex.status  # `_int` only for what is not a plain int in range
    response_bytes: int | None = ex.response_bytes
    chunks: int | None = ex.chunks
    if status.__class__ is not int or not -_INT32 <= status < _INT32:
        status = _int(status)
    if response_bytes.__class__ is not int or not -_INT64 <= response_bytes < _INT64:
        response_bytes = _int(response_bytes, _INT64)
    if chunks.__class__ is not int or not -_INT32 <= chunks < _INT32:
        chunks = _int(chunks)
    return (
        ex.id,  # id
        datetime.fromtimestamp(ex.started_at, UTC),  # started_at
        method or "",  # method
        path or "",  # path
        query or "",  # query
        upstream or "",  # upstream
        upstream_url or "",  # upstream_url
        status,  # status
        bool(ex.stream),  # stream
        model,  # model
        response_model or _text(response.get("model")),  # response_model
        outcome or "ok",  # outcome
        error,  # error
        _body_json(bodies.request, ex.request_body),  # request
        bodies.request_body,  # request_body
        ex.omit_request,  # request_omitted
        _body_json(bodies.response, ex.response_body),  # response
        bodies.response_body,  # response_body
        ex.omit_response,  # response_omitted
        response_bytes or 0,  # response_bytes
        content_type,  # content_type
        ttfb_ms,  # ttfb_ms
        ttft_ms,  # ttft_ms
        duration_ms,  # duration_ms
        chunks or 0,  # chunks
        upstream_request_id,  # upstream_request_id
        key_hash,  # key_hash
        key_hint,  # key_hint
        user,  # end_user
        replay_of,  # replay_of
        usage_source,  # usage_source
        system_fingerprint or _text(response.get("system_fingerprint")),  # system_fingerprint
        dumps(list(ex.parse_errors)) if ex.parse_errors else None,  # parse_errors
        cost_usd,  # cost_usd
        price_entry,  # price_entry
        None if ex.redacted is None else dumps(ex.redacted),  # redacted
        session,  # session
        turn_key,  # turn_key
        parent_key,  # parent_key
        service_tier,  # service_tier
    )


def usage_row(exchange_id: str, usage: dict[str, Any], tokens: Usage | None) -> Row:
    """The usage as reported (`raw`) and as decoded (`tokens`: None for a shape we cannot
    read, whose columns stay empty)."""
    values: tuple[int | None, ...] = _NO_TOKENS if tokens is None else tokens
    # Decoded counts are never negative; one past the column's range is not kept.
    if max(filter(None, values), default=0) >= _INT32:
        values = tuple(v if v is None or v < _INT32 else None for v in values)
    (input_, cached, cache_write, input_audio, cached_audio, input_image, cached_image) = values[:7]
    (output, reasoning, output_audio, output_image, total, accepted, rejected) = values[7:]
    return {
        "exchange_id": exchange_id,
        "prompt_tokens": input_,
        "completion_tokens": output,
        "total_tokens": total,
        "cached_tokens": cached,
        "prompt_audio_tokens": input_audio,
        "reasoning_tokens": reasoning,
        "completion_audio_tokens": output_audio,
        "accepted_prediction_tokens": accepted,
        "rejected_prediction_tokens": rejected,
        "raw": dumps(usage),
        "cache_write_tokens": cache_write,
        "cached_audio_tokens": cached_audio,
        "prompt_image_tokens": input_image,
        "cached_image_tokens": cached_image,
        "completion_image_tokens": output_image,
    }


_NO_TOKENS = (None,) * len(Usage._fields)


def _is_chat_completion(response: dict[str, Any]) -> bool:
    if response.get("object") == "chat.completion":
        return True
    found = response.get("choices")
    return isinstance(found, list) and any("message" in _dict(c) for c in found)


def _completion_rows(exchange_id: str, response: dict[str, Any], rows: Rows) -> None:
    rows.completions.append(
        {
            "exchange_id": exchange_id,
            "completion_id": _text(response.get("id")),
            "object": _text(response.get("object")),
            "created": _int(response.get("created"), _INT64),
            "model": _text(response.get("model")),
            "system_fingerprint": _text(response.get("system_fingerprint")),
            "service_tier": _text(response.get("service_tier")),
        }
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
            {
                "exchange_id": exchange_id,
                "choice_index": index,
                "role": _text(message.get("role")),
                "content": _text(message.get("content")),
                "refusal": _text(message.get("refusal")),
                "finish_reason": _text(choice.get("finish_reason")),
                "tool_calls": _json(message.get("tool_calls")),
                "function_call": _json(message.get("function_call")),
                "audio": _json(message.get("audio")),
            }
        )
        logprobs = _dict(choice.get("logprobs"))
        for kind in ("content", "refusal"):
            tokens = logprobs.get(kind)
            if isinstance(tokens, list):
                rows.logprobs.extend(logprob_records(exchange_id, index, kind, tokens))
