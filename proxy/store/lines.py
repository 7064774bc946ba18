"""An exchange as one line of the journal: `{"v": 1, "exchange": {...}}`, holding exactly what
the database would store (omitted bodies are already gone; raw bodies base64)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import fields
from typing import BinaryIO

import orjson

from proxy.exchange import Exchange
from proxy.store.bodies import stored_bodies
from proxy.stream.rawcopy import compress_whole
from proxy.text import json_bytes
from proxy.usage import Usage

_VERSION = 1
_FIELDS = tuple(f.name for f in fields(Exchange))
_BYTES_FIELDS = ("request_body", "response_body", "raw_stream_gz")


def encode(ex: Exchange) -> bytes:
    """The record's journal line. Its fields are written out in `Exchange`'s order (a test
    holds the two together): a dict display is built in one step, where a comprehension
    over the fields' names cost as much as the JSON encoding."""
    bodies = stored_bodies(ex)
    record = {
        "id": ex.id,
        "started_at": ex.started_at,
        "method": ex.method,
        "path": ex.path,
        "query": ex.query,
        "upstream": ex.upstream,
        "upstream_url": ex.upstream_url,
        "status": ex.status,
        "stream": ex.stream,
        "model": ex.model,
        "request_body": _base64(bodies.request_body),
        "request_json": bodies.request,
        "response_body": _base64(bodies.response_body),
        "response_json": bodies.response,
        "response_bytes": ex.response_bytes,
        "content_type": ex.content_type,
        "outcome": ex.outcome,
        "error": ex.error,
        "ttfb_ms": ex.ttfb_ms,
        "ttft_ms": ex.ttft_ms,
        "duration_ms": ex.duration_ms,
        "chunks": ex.chunks,
        "upstream_request_id": ex.upstream_request_id,
        "key_hash": ex.key_hash,
        "key_hint": ex.key_hint,
        "user": ex.user,
        "tags": ex.tags,
        "replay_of": ex.replay_of,
        "session": ex.session,
        "usage": ex.usage,
        "usage_source": ex.usage_source,
        "response_model": ex.response_model,
        "system_fingerprint": ex.system_fingerprint,
        "parse_errors": ex.parse_errors,
        "omit_request": ex.omit_request,
        "omit_response": ex.omit_response,
        "traceparent": ex.traceparent,
        "raw_stream_gz": _base64(bodies.raw_stream_gz),
        "raw_pacing": ex.raw_pacing,
        "redacted": ex.redacted,
        "tokens": None if ex.tokens is None else list(ex.tokens),
        "service_tier": ex.service_tier,
        "batch": ex.batch,
        "cost_usd": ex.cost_usd,
        "price_entry": ex.price_entry,
        "batch_line": ex.batch_line,
    }
    return json_bytes({"v": _VERSION, "exchange": record}) + b"\n"


def _base64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode("ascii")


def decode(line: bytes) -> Exchange:
    """The exchange on one journal line; ValueError if the line is not a record."""
    try:
        outer = orjson.loads(line)
    except orjson.JSONDecodeError:
        outer = json.loads(line)  # ints beyond 64 bits; raises ValueError if not JSON at all
    record = outer.get("exchange") if isinstance(outer, dict) else None
    if not isinstance(outer, dict) or outer.get("v") != _VERSION or not isinstance(record, dict):
        raise ValueError("not a version 1 journal record")
    kwargs = {name: record[name] for name in _FIELDS if name in record}
    for name in _BYTES_FIELDS:
        if kwargs.get(name) is not None:
            kwargs[name] = base64.b64decode(kwargs[name], validate=True)
    if record.get("raw_stream") is not None:  # a line written before streams were compressed
        raw = base64.b64decode(record["raw_stream"], validate=True)
        kwargs["raw_stream_gz"] = compress_whole(raw)
    if isinstance(kwargs.get("tokens"), list):
        kwargs["tokens"] = Usage(*kwargs["tokens"])
    if isinstance(kwargs.get("raw_pacing"), list):
        kwargs["raw_pacing"] = [tuple(pair) for pair in kwargs["raw_pacing"]]
    try:
        ex = Exchange(**kwargs)
    except TypeError as exc:
        raise ValueError(f"incomplete record: {exc}") from None
    if not isinstance(ex.id, str) or not isinstance(ex.started_at, int | float):
        raise ValueError("record without a valid id or started_at")
    return ex


def whole_lines(f: BinaryIO, budget: int) -> Iterator[bytes]:
    """Whole lines within the next `budget` bytes of `f` (a line cut by a crash counts as one)."""
    while budget > 0:
        line = f.readline(budget)
        if not line:
            return
        budget -= len(line)
        yield line
