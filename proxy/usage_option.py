"""Asking a stream's upstream for its usage (`stream_usage = "inject"`).

OpenAI reports a stream's usage only when the request sets `stream_options.include_usage`.
When the client did not, the proxy adds it to the body it sends upstream, and the tee cuts the
usage event out of what the client gets (`withhold.py`). The key is added after the client's
last one, so the upstream gets the client's own bytes plus that key (numbers, escapes and
spacing as sent), and nothing is serialised on the way to the first byte.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

_USAGE_OPTION = b',"stream_options":{"include_usage":true}}'
_STREAM = b'"stream'
_ESCAPED_KEY_CHAR = re.compile(rb"\\u00[5-7]")
"""A `\\u` escape of a character that "stream_options" is spelled with (or its neighbours
in ASCII): a key spelled so is found only by parsing."""
READ_LIMIT = 8 * 1024
"""Bodies up to this many bytes have "stream" read off their bytes; longer ones are parsed
(`asks_for_stream`): past it, searching costs more than parsing."""


@dataclass(slots=True)
class UpstreamBody:
    """What goes upstream for a request body."""

    original: bytes
    """The body as the client sent it."""
    sent: bytes
    injected: bool = False
    """`sent` asks for usage the client did not ask for."""
    guessed: bool = False
    """The stream was read off the bytes, unparsed: the guess may be wrong (`refused_guess`)."""
    payload: Any = None
    """`original` parsed, when it had to be."""

    def refused_guess(self, status: int) -> bool:
        """Whether a 400 from the upstream means the guess was wrong: the "stream" key
        `asks_for_stream` read was a nested object's, and the upstream refuses stream_options
        without a stream, as OpenAI does. Then the body goes again as it came (no answer was
        generated), and `sent`, `injected` say so."""
        if not (self.guessed and status == 400):
            return False
        if self.payload is None:
            self.payload = parse_json_body(self.original)
        if isinstance(self.payload, dict) and self.payload.get("stream") is True:
            return False
        self.sent, self.injected, self.guessed = self.original, False, False
        return True


def upstream_body(body: bytes, *, inject: bool) -> UpstreamBody:
    """The body to send upstream; with `inject`, one that asks for a stream's usage."""
    if not inject:
        return UpstreamBody(body, body)
    streaming = asks_for_stream(body)
    if streaming is None:  # only parsing can tell
        payload = parse_json_body(body)
        if isinstance(payload, dict) and payload.get("stream") is True:
            sent, injected = _ask_for_usage(payload, body)
            return UpstreamBody(body, sent, injected, payload=payload)
        return UpstreamBody(body, body, payload=payload)
    if streaming:
        return UpstreamBody(body, _with_usage_option(body), injected=True, guessed=True)
    return UpstreamBody(body, body)


def parse_json_body(body: bytes) -> Any:
    """A JSON body parsed; None when it is not JSON."""
    if not body or body[:1] not in (b"{", b"["):
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def asks_for_stream(body: bytes) -> bool | None:
    """Whether a request body asks for a stream, read off its bytes without parsing them:
    orjson wakes cold on an idle proxy, and the first byte would wait for it.

    The answer is from the one place the key `"stream"` appears: no `"stream"` at all is
    False; `"stream"` once, as a key, with `true` or `false` after it is that. Otherwise, or
    when `"stream_options"` is there too (to be merged, not added) or the body does not start
    with `{`, None: only parsing can tell. A JSON string cannot hold `"stream"` unescaped, so
    a lone match is a key, but it may be a nested object's: then the request asks for no
    stream at all, and a True here is wrong (`UpstreamBody.refused_guess`); an upstream that
    takes the option answers no stream, so nothing is withheld. A body with a `\\u` escape of
    a lowercase letter or `_` is parsed: JSON may spell a key so (`"str\\u0065am"`), and
    searching for the plain key would miss it. Past `READ_LIMIT` bytes, None.
    """
    if len(body) > READ_LIMIT or (b"\\" in body and _ESCAPED_KEY_CHAR.search(body)):
        return None
    key = -1
    at = body.find(_STREAM)
    while at != -1:
        after = at + len(_STREAM)
        follows = body[after : after + 1]
        if follows == b'"':
            if key != -1 or body[at - 1 : at] == b"\\":
                return None
            key = at
        elif follows == b"_" and body.startswith(b'_options"', after):
            return None
        at = body.find(_STREAM, after)
    if key == -1:
        return False
    value = body[key + len(_STREAM) + 1 : key + 40].lstrip()
    if value[:1] != b":":
        return None  # a string value "stream", not the key
    value = value[1:].lstrip()
    if value.startswith(b"false"):
        return False
    if value.startswith(b"true") and body[:1] == b"{" and body.rstrip().endswith(b"}"):
        return True
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
