"""Which headers cross the proxy, in each direction, and what the control headers and the API
key say for the record."""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, field
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
CONTROL_PREFIX = "x-flightrec-"
SUPPORTED_ENCODINGS = frozenset({"gzip", "x-gzip", "deflate"})
"""Content encodings the proxy can decode for the record; others are not offered upstream."""

Headers = CIMultiDictProxy[str] | CIMultiDict[str]


def _connection_tokens(headers: Headers) -> set[str] | frozenset[str]:
    """The headers named in `Connection` (hop-by-hop for this connection only)."""
    values = headers.getall("Connection", ())
    if not values:
        return frozenset()
    tokens: set[str] = set()
    for value in values:
        tokens.update(token.strip().lower() for token in value.split(","))
    return tokens


def _accept_encoding(value: str) -> str:
    """Keep only the codings the record can decode, so the record is right for any upstream."""
    kept = []
    for part in value.split(","):
        coding = part.split(";")[0].strip().lower()
        if coding in SUPPORTED_ENCODINGS or coding == "identity":
            kept.append(part.strip())
    return ", ".join(kept) or "identity"


_NOT_UPSTREAM = HOP_BY_HOP | {"host", "content-length"}


def upstream_headers(
    headers: Headers,
    *,
    identity_encoding: bool,
    controls: list[tuple[str, str]] | None = None,
) -> CIMultiDict[str]:
    """The client's headers as the upstream gets them: less hop-by-hop, Host, length, controls.

    `identity_encoding` asks for an uncompressed body: the proxy must cut an event out of it.
    The control headers left out are appended to `controls` when given, so that the record
    need not look for them again (`control_headers`). One pass, on every request's way
    upstream.
    """
    listed = _connection_tokens(headers)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        lower = name.lower()
        if lower.startswith(CONTROL_PREFIX):  # (even one named in `Connection`)
            if controls is not None:
                controls.append((lower, value))
            continue
        if lower in _NOT_UPSTREAM or lower in listed:
            continue
        if lower == "accept-encoding":
            value = "identity" if identity_encoding else _accept_encoding(value)
        out.add(name, value)
    if identity_encoding and "Accept-Encoding" not in out:
        out["Accept-Encoding"] = "identity"
    return out


_HOP_BY_HOP_AND_LENGTH = HOP_BY_HOP | {"content-length"}


def response_headers(headers: Headers, length_changes: bool) -> list[tuple[str, str]]:
    """The upstream's headers as the client gets them: less hop-by-hop (and the length, when
    the proxy withholds an event and so changes it)."""
    drop = _HOP_BY_HOP_AND_LENGTH if length_changes else HOP_BY_HOP
    listed = _connection_tokens(headers)
    if listed:
        drop = drop | listed
    return [(name, value) for name, value in headers.items() if name.lower() not in drop]


@dataclass(slots=True)
class Controls:
    tags: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    omit_request: bool = False
    omit_response: bool = False
    replay_of: str | None = None
    session: str | None = None


def control_headers(headers: Headers, found: list[tuple[str, str]] | None = None) -> Controls:
    """Read the `X-Flightrec-*` headers (SPEC section 2); they never reach the upstream.
    `found`: the control headers of `headers` as `upstream_headers` collected them, read
    instead of every header."""
    controls = Controls()
    for name, value in headers.items() if found is None else found:
        lower = name.lower()
        if not lower.startswith(CONTROL_PREFIX):
            continue
        what = lower[len(CONTROL_PREFIX) :]
        if what.startswith("tag-") and len(what) > 4:
            controls.tags[what[4:]] = value
        elif what == "user":
            controls.user = value or None
        elif what == "omit":
            parts = {p.strip().lower() for p in value.split(",")}
            controls.omit_request = bool(parts & {"request", "all"})
            controls.omit_response = bool(parts & {"response", "all"})
        elif what == "replay-of":
            controls.replay_of = value or None
        elif what == "session":
            controls.session = value.strip() or None
    return controls


_NO_KEY = (None, None)


def key_identity(headers: Any) -> tuple[str | None, str | None]:
    """`key_hash` (SHA-256 hex prefix) and `key_hint` of the API key; the key never leaves."""
    auth = headers.get("Authorization")
    found = _from_authorization(auth) if auth else None
    if found is not None:
        return found
    key = headers.get("api-key") or headers.get("x-api-key")
    return _identify(key) if key else _NO_KEY


@functools.lru_cache(maxsize=1024)
def _from_authorization(auth: str) -> tuple[str, str] | None:
    """What `Authorization` names (None: no key in it). Clients send the same few values over
    and over: each is read and hashed once."""
    scheme, _, credentials = auth.partition(" ")
    key = credentials.strip() if scheme.lower() == "bearer" else auth.strip()
    return _identify(key) if key else None


@functools.lru_cache(maxsize=1024)
def _identify(key: str) -> tuple[str, str]:
    """Hashed once per key (`_from_authorization`, and the `api-key` headers)."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    hint = f"{key[:3]}...{key[-4:]}" if len(key) >= 12 else "..."
    return digest, hint
