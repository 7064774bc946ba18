"""An exchange as one line of the journal: `{"v": 1, "exchange": {...}}`, holding exactly what
the database would store (omitted bodies are already gone; raw bodies base64).

A body that parsed as JSON goes into the line as the text it was parsed from, not serialised
again: the database keeps that same text (`rows._body_json`), and for a long body, a response
with logprobs above all, serialising it was most of the line's work (docs/performance.md)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import fields
from typing import Any, BinaryIO

import orjson

from proxy.exchange import Exchange
from proxy.store.bodies import stored_bodies
from proxy.stream.rawcopy import compress_whole
from proxy.text import json_bytes
from proxy.usage import Usage

_VERSION = 1
_FIELDS = tuple(f.name for f in fields(Exchange))
_BYTES_FIELDS = ("request_body", "response_body", "raw_stream_gz")
_RECORD = dict.fromkeys(_FIELDS)


def encode(ex: Exchange) -> bytes:
    """The record's journal line: every field of the exchange, in `Exchange`'s order, the
    bodies as the database keeps them (`stored_bodies`: JSON, else raw bytes in base64)."""
    bodies = stored_bodies(ex)
    # Every key set on a copy of a dict that holds them all, in the line's order: a dict
    # display this long is built in chunks, each merged into the next and grown on the way.
    record = _RECORD.copy()
    record["id"] = ex.id
    record["started_at"] = ex.started_at
    record["method"] = ex.method
    record["path"] = ex.path
    record["query"] = ex.query
    record["upstream"] = ex.upstream
    record["upstream_url"] = ex.upstream_url
    record["status"] = ex.status
    record["stream"] = ex.stream
    record["model"] = ex.model
    record["request_body"] = _base64(bodies.request_body)
    record["request_json"] = _source(bodies.request, ex.request_body)
    record["response_body"] = _base64(bodies.response_body)
    record["response_json"] = _source(bodies.response, ex.response_body)
    record["response_bytes"] = ex.response_bytes
    record["content_type"] = ex.content_type
    record["outcome"] = ex.outcome
    record["error"] = ex.error
    record["ttfb_ms"] = ex.ttfb_ms
    record["ttft_ms"] = ex.ttft_ms
    record["duration_ms"] = ex.duration_ms
    record["chunks"] = ex.chunks
    record["upstream_request_id"] = ex.upstream_request_id
    record["key_hash"] = ex.key_hash
    record["key_hint"] = ex.key_hint
    record["user"] = ex.user
    record["tags"] = ex.tags
    record["replay_of"] = ex.replay_of
    record["session"] = ex.session
    record["usage"] = ex.usage
    record["usage_source"] = ex.usage_source
    record["response_model"] = ex.response_model
    record["system_fingerprint"] = ex.system_fingerprint
    record["parse_errors"] = ex.parse_errors
    record["omit_request"] = ex.omit_request
    record["omit_response"] = ex.omit_response
    record["traceparent"] = ex.traceparent
    record["raw_stream_gz"] = _base64(bodies.raw_stream_gz)
    record["raw_pacing"] = ex.raw_pacing
    record["redacted"] = ex.redacted
    record["tokens"] = None if ex.tokens is None else list(ex.tokens)
    record["service_tier"] = ex.service_tier
    record["batch"] = ex.batch
    record["cost_usd"] = ex.cost_usd
    record["price_entry"] = ex.price_entry
    record["batch_line"] = ex.batch_line
    line = {"v": _VERSION, "exchange": record}
    try:
        return orjson.dumps(line) + b"\n"
    except TypeError:  # what orjson refuses: `json_bytes`' fallbacks, which know no Fragment
        record["request_json"], record["response_json"] = bodies.request, bodies.response
        return json_bytes(line) + b"\n"


SOURCE_FROM = 2048
"""Bytes from which a body's text is taken for its JSON: for a short body, looking at the text
is dearer than serialising the JSON again (docs/performance.md)."""


def _source(parsed: Any, raw: bytes | None) -> Any:
    """A parsed body as it stands in the line: the text it was parsed from, where there is one
    at least `SOURCE_FROM` bytes long.

    A body's JSON is parsed from its bytes and kept with them (redaction writes the text anew
    when it changes the JSON), so orjson has accepted that text: valid UTF-8, no raw control
    character inside a string. Line feeds can only stand between its tokens, where a space
    means the same, and the journal's lines end at line feeds."""
    if raw is None or len(raw) < SOURCE_FROM or not _framed(raw, parsed):
        return parsed
    if not raw.isascii():
        try:
            raw.decode()
        except UnicodeDecodeError:  # cannot be what a JSON parser accepted: not its source
            return parsed
    if b"\n" in raw:
        raw = raw.replace(b"\n", b" ")
    return orjson.Fragment(raw)


_FRAMES: dict[type, tuple[bytes, bytes]] = {dict: (b"{", b"}"), list: (b"[", b"]")}


def _framed(raw: bytes, parsed: Any) -> bool:
    """Whether `raw` opens and closes as `parsed` (an object or an array) does: bytes kept
    beside a JSON they are not the text of would make a line no reader can parse."""
    frame = _FRAMES.get(parsed.__class__)
    if frame is None:
        return False  # a scalar or nothing: serialised, as cheap as looking
    if raw[:1] != frame[0] or raw[-1:] != frame[1]:
        raw = raw.strip()
    return raw[:1] == frame[0] and raw[-1:] == frame[1]


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
