"""Asking a stream's upstream for its usage (`stream_usage = "inject"`).

OpenAI reports a stream's usage only when the request sets `stream_options.include_usage`.
When the client did not, the proxy adds it to the body it sends upstream, and the tee cuts the
usage event out of what the client gets (`withhold.py`). The key is added after the client's
last one, so the upstream gets the client's own bytes plus that key (numbers, escapes and
spacing as sent), and nothing is serialised on the way to the first byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

_USAGE_OPTION = b',"stream_options":{"include_usage":true}}'


@dataclass(slots=True)
class UpstreamBody:
    """What goes upstream for a request body."""

    original: bytes
    """The body as the client sent it."""
    sent: bytes
    injected: bool = False
    """`sent` asks for usage the client did not ask for."""
    payload: Any = None
    """`original` parsed (None when it is not JSON, or was not parsed)."""


def upstream_body(body: bytes, *, inject: bool) -> UpstreamBody:
    """The body to send upstream; with `inject`, a stream's asks for its usage."""
    if not inject:
        return UpstreamBody(body, body)
    payload = parse_json_body(body)
    if isinstance(payload, dict) and payload.get("stream") is True:
        sent, injected = _ask_for_usage(payload, body)
        return UpstreamBody(body, sent, injected, payload)
    return UpstreamBody(body, body, payload=payload)


def parse_json_body(body: bytes) -> Any:
    """A JSON body parsed; None when it is not JSON."""
    if not body or body[:1] not in (b"{", b"["):
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _with_usage_option(body: bytes) -> bytes:
    """A JSON object's bytes with `stream_options.include_usage` added after its last key."""
    return body.rstrip()[:-1] + _USAGE_OPTION


def _ask_for_usage(payload: dict[str, Any], body: bytes) -> tuple[bytes, bool]:
    """The body with `stream_options.include_usage` set, unless the client asked already.
    `payload` is `body` parsed, so the body is an object ending in `}`."""
    if "stream_options" not in payload:
        return _with_usage_option(body), True
    options = payload.get("stream_options")
    if options is None:
        options = {}
    if not isinstance(options, dict) or options.get("include_usage") is True:
        return body, False
    return orjson.dumps({**payload, "stream_options": {**options, "include_usage": True}}), True
