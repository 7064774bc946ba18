"""Exchanges into rows: pure, no I/O. Every row the writers insert is built straight as the
drivers' tuple (`Record`), in its table's column order: the exchange's own row (read by index
through `tables.EXCHANGE_AT`) and its children's (tags, completion, choices, usage, logprobs,
raw stream; `named` reads one by column name). Rows as dicts cost more to build and to turn
into those tuples than the rest of the row building (docs/performance.md).

`rows_for` builds every row of one exchange (the exchange, tags, completion, choices, usage,
logprobs, raw stream, fingerprint count) from the exchange's settled figures: its decoded
usage, cost and price entry (`proxy.sinks.settle`). Row building tolerates any JSON shape: a
vendor's odd response loses its projection rows, never its record. The writers
(`sqlite_writer`, `pg_writer`) take a batch's records table by table (`store.records`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

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
    """One exchange's rows, by table: each a record in its table's column order."""

    exchange: Record
    """The `exchanges` row, times as aware datetimes (`exchange_fields` names its columns)."""
    tags: Sequence[Record] = ()
    completions: Sequence[Record] = ()
    choices: Sequence[Record] = ()
    usage: Sequence[Record] = ()
    logprobs: Sequence[Record] = ()
    """A row per token (`store.logprob_rows`)."""
    raw_streams: Sequence[Record] = ()
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


def named(table: sa.Table, record: Record) -> Row:
    """A record of `table` (a child row of `Rows`) by column name."""
    return dict(zip(table.columns.keys(), record, strict=True))


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
    response = ex.response_json
    if response.__class__ is not dict:
        response = _dict(response)
    usage = ex.usage if isinstance(ex.usage, dict) else _dict(response.get("usage")) or None
    bodies = stored_bodies(ex)
    exchange = _exchange_row(ex, response, bodies)
    exchange_id = ex.id
    tags: Sequence[Record] = ()
    if ex.tags:
        tags = [
            (exchange_id, _text(key), _text(value) or "")
            for key, value in ex.tags.items()
            if isinstance(key, str)
        ]
    usages = () if usage is None else (usage_row(exchange_id, usage, ex.tokens),)
    completions: Sequence[Record] = ()
    choices: Sequence[Record] = ()
    logprobs: list[Record] = []
    # Choices and logprobs are the response's content: an omitted response has none of them.
    if ex.omit_response:
        pass
    elif _is_chat_completion(response):
        completions, choices = _completion_rows(exchange_id, response, logprobs)
    elif response.get("object") == "text_completion":
        for index, tokens in completion_tokens(response):
            logprobs += logprob_records(exchange_id, index, "content", tokens)
    gz = bodies.raw_stream_gz
    streams = () if gz is None else ((exchange_id, gz, _pacing(ex.raw_pacing)),)
    fingerprint = None
    if exchange[_FINGERPRINT] is not None:
        fingerprint = {
            "upstream": exchange[_UPSTREAM],
            "model": exchange[_RESPONSE_MODEL] or exchange[_MODEL] or "",
            "system_fingerprint": exchange[_FINGERPRINT],
            "first_seen": exchange[_STARTED_AT],
            "last_seen": exchange[_STARTED_AT],
            "count": 1,
        }
    return Rows(exchange, tags, completions, choices, usages, logprobs, streams, fingerprint)


def _pacing(pacing: Any) -> str | None:
    """A stream's pacing as JSON lists of pairs."""
    if not isinstance(pacing, list):
        return None
    if _PAIRS.issuperset(map(type, pacing)):  # JSON writes a tuple as it writes a list
        return dumps(pacing)
    return dumps([list(p) for p in pacing])


_UPSTREAM, _MODEL, _RESPONSE_MODEL, _FINGERPRINT, _STARTED_AT = (
    t.EXCHANGE_AT[name]
    for name in ("upstream", "model", "response_model", "system_fingerprint", "started_at")
)
_COLUMNS = tuple(t.EXCHANGE_AT)


def exchange_fields(record: Record) -> Row:
    """An `exchanges` record (`Rows.exchange`) by column name."""
    return dict(zip(_COLUMNS, record, strict=True))


def _exchange_values(ex: Exchange) -> tuple[Any, ...]:
    """The fields of the text columns, each as `_text` makes it, then those of the float
    columns, each as `_float` makes it. Read one by one, not by an attrgetter: the
    interpreter reads a slot without a lookup by name."""
    return _texts(
        (
            ex.method,
            ex.path,
            ex.query,
            ex.upstream,
            ex.upstream_url,
            ex.model,
            ex.response_model,
            ex.outcome,
            ex.error,
            ex.content_type,
            ex.upstream_request_id,
            ex.key_hash,
            ex.key_hint,
            ex.user,
            ex.replay_of,
            ex.usage_source,
            ex.system_fingerprint,
            ex.price_entry,
            ex.session,
            ex.service_tier,
        )
    ) + _floats((ex.ttfb_ms, ex.ttft_ms, ex.duration_ms, ex.cost_usd))


def _exchange_row(ex: Exchange, response: dict[str, Any], bodies: Bodies) -> Record:
    """The `exchanges` record in `tables.exchanges`' column order (tests/store checks it)."""
    values = _exchange_values(ex)
    method, path, query, upstream, upstream_url, model, response_model = values[:7]
    outcome, error, content_type, upstream_request_id, key_hash, key_hint = values[7:13]
    user, replay_of, usage_source, system_fingerprint, price_entry, session = values[13:19]
    service_tier, ttfb_ms, ttft_ms, duration_ms, cost_usd = values[19:]
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


def usage_row(exchange_id: str, usage: dict[str, Any], tokens: Usage | None) -> Record:
    """The usage as reported (`raw`) and as decoded (`tokens`: None for a shape we cannot
    read, whose columns stay empty), in `tables.usage`' column order."""
    values: tuple[int | None, ...] = _NO_TOKENS if tokens is None else tokens
    # Decoded counts are never negative; one past the column's range is not kept.
    if max(filter(None, values), default=0) >= _INT32:
        values = tuple(v if v is None or v < _INT32 else None for v in values)
    (input_, cached, cache_write, input_audio, cached_audio, input_image, cached_image) = values[:7]
    (output, reasoning, output_audio, output_image, total, accepted, rejected) = values[7:]
    return (
        exchange_id,
        input_,  # prompt_tokens
        output,  # completion_tokens
        total,  # total_tokens
        cached,  # cached_tokens
        input_audio,  # prompt_audio_tokens
        reasoning,  # reasoning_tokens
        output_audio,  # completion_audio_tokens
        accepted,  # accepted_prediction_tokens
        rejected,  # rejected_prediction_tokens
        dumps(usage),  # raw
        cache_write,  # cache_write_tokens
        cached_audio,  # cached_audio_tokens
        input_image,  # prompt_image_tokens
        cached_image,  # cached_image_tokens
        output_image,  # completion_image_tokens
    )


_NO_TOKENS = (None,) * len(Usage._fields)


def _is_chat_completion(response: dict[str, Any]) -> bool:
    if response.get("object") == "chat.completion":
        return True
    found = response.get("choices")
    return isinstance(found, list) and any("message" in _dict(c) for c in found)


def _completion_rows(
    exchange_id: str, response: dict[str, Any], logprobs: list[Record]
) -> tuple[list[Record], list[Record]]:
    """The `completions` and `choices` records of a chat completion; its logprob records go
    into `logprobs`."""
    get = response.get
    completion_id, object_, model, fingerprint, tier = _texts(
        (get("id"), get("object"), get("model"), get("system_fingerprint"), get("service_tier"))
    )
    created = _int(get("created"), _INT64)
    completions = [(exchange_id, completion_id, object_, created, model, fingerprint, tier)]
    found = get("choices")
    seen: set[int] = set()
    choices = []
    for position, raw in enumerate(found if isinstance(found, list) else []):
        choice = raw if raw.__class__ is dict else _dict(raw)
        index = _int(choice.get("index"))
        index = position if index is None or index in seen else index
        seen.add(index)
        message = _dict(choice.get("message"))
        role, content, refusal, finish_reason = _texts(
            (
                message.get("role"),
                message.get("content"),
                message.get("refusal"),
                choice.get("finish_reason"),
            )
        )
        choices.append(
            (
                exchange_id,
                index,  # choice_index
                role,
                content,
                refusal,
                finish_reason,
                _json(message.get("tool_calls")),
                _json(message.get("function_call")),
                _json(message.get("audio")),
            )
        )
        found_logprobs = choice.get("logprobs")
        if isinstance(found_logprobs, dict):
            for kind in ("content", "refusal"):
                tokens = found_logprobs.get(kind)
                if isinstance(tokens, list):
                    logprobs += logprob_records(exchange_id, index, kind, tokens)
    return completions, choices
