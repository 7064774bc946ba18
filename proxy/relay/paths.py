"""Where a request goes, and what of its URL the record keeps.

Routing: a path is normalised before it is matched to an upstream, so that no path reaches
anything outside the upstream's base path. Dot segments (`.`, `..`, also percent-encoded as
`%2e`) are resolved as RFC 3986 section 5.2.4 resolves them; a path whose `..` would climb out
of the prefix it was sent to (or above the root) is refused. A segment holding an encoded
slash or backslash (`%2f`, `%5c`) around a dot segment (`..%2fadmin`) is refused too: some
servers decode those into separators and would resolve the `..` themselves.

Recording: secret-named query parameters (`?key=...`) are masked in what is stored; the
upstream still gets the query as it came.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from proxy.config import Upstream

Route = tuple[Upstream, str]
"""The upstream and the rest of the path after its prefix (with the query, if any)."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A path that would leave the base path of `upstream`, the upstream it was sent to."""

    upstream: Upstream
    rest: str


def match_upstream(upstreams: tuple[Upstream, ...], raw_path: str) -> Route | None:
    """The upstream whose prefix is the longest match for the path, and the rest of the path.

    A prefix matches whole path segments only: `/v1` serves `/v1/models`, never `/v10/models`.
    """
    best: Route | None = None
    for upstream in upstreams:
        prefix = "" if upstream.prefix == "/" else upstream.prefix
        rest = raw_path[len(prefix) :]
        if not raw_path.startswith(prefix) or rest[:1] not in ("", "/", "?"):
            continue
        if best is None or len(prefix) > len(best[0].prefix):
            best = (upstream, rest)
    return best


def route(upstreams: tuple[Upstream, ...], raw_path: str) -> Route | Refused | None:
    """Where `raw_path` (the path and query as sent) goes: a route on its normalised path, a
    refusal when normalising takes it out of the prefix it was sent to, or None (no upstream
    serves it)."""
    path, mark, query = raw_path.partition("?")
    clean = normalise(path)
    if clean == path:
        return match_upstream(upstreams, raw_path)
    asked = match_upstream(upstreams, path)
    target = None if clean is None else match_upstream(upstreams, clean)
    if target is not None and (asked is None or asked[0] is target[0]):
        return target[0], target[1] + mark + query
    if asked is not None:
        return Refused(asked[0], asked[1] + mark + query)
    return None


_ENCODED_DOT = re.compile("%2e", re.IGNORECASE)
_SEPARATOR = re.compile(r"%2f|%5c|\\", re.IGNORECASE)


def normalise(path: str) -> str | None:
    """`path` (as sent, percent-encoded) with its dot segments resolved; None when a `..`
    climbs above the root or a segment hides a dot segment (`_hides_dot_segment`)."""
    if "/." not in path and "%" not in path and "\\" not in path:
        return path  # nearly every request: nothing to resolve
    out: list[str] = []
    segments = path.split("/")
    for at, segment in enumerate(segments):
        dots = _ENCODED_DOT.sub(".", segment)
        if dots in (".", ".."):
            if dots == "..":
                if len(out) <= 1:  # out[0] is the empty segment before the leading "/"
                    return None
                out.pop()
            if at == len(segments) - 1:
                out.append("")  # "/v1/models/." is the directory "/v1/models/"
            continue
        if _hides_dot_segment(dots):
            return None
        out.append(segment)
    return "/".join(out)


def _hides_dot_segment(segment: str) -> bool:
    """A segment that some server may still read as holding a dot segment: around an encoded
    slash or a backslash (`..%2fadmin`), or before path parameters (`..;x`, as Tomcat reads
    it). `segment` has its encoded dots decoded."""
    if "." not in segment:
        return False
    return any(part.partition(";")[0] in (".", "..") for part in _SEPARATOR.split(segment))


SECRET_NAMES = frozenset({"pass", "passphrase"})
"""Normalised query parameter names (`_secret_name`) masked as they are."""
SECRET_SUFFIXES = (
    "key",
    "token",
    "secret",
    "password",
    "passwd",
    "pwd",
    "signature",
    "sig",
    "credential",
    "credentials",
    "jwt",
    "bearer",
    "auth",
    "authorization",
)
"""Normalised names ending in one of these are masked: `accessToken`, `X-Goog-Api-Key`,
`subscription-key`, `X-Amz-Credential`. A harmless name masked by mistake (`monkey`) costs a
value in the record; a secret missed leaks it."""
MASK = "***"


def mask_query(query: str) -> str:
    """`query` (as aiohttp decodes it, `&` and `=` inside values still encoded) with the
    values of secret-named parameters replaced by `MASK`."""
    if not query:
        return query
    pairs = query.split("&")
    for at, pair in enumerate(pairs):
        name, equals, _ = pair.partition("=")
        if equals and _secret_name(name):
            pairs[at] = f"{name}={MASK}"
    return "&".join(pairs)


_SEPARATORS = str.maketrans("", "", "-_. ")


def _secret_name(name: str) -> bool:
    """Whether a query parameter named `name` holds a secret: compared lower-cased without
    `-`, `_`, `.` or spaces, so that `access_token`, `accessToken` and `Access-Token` agree."""
    normal = name.lower().translate(_SEPARATORS)
    return normal in SECRET_NAMES or normal.endswith(SECRET_SUFFIXES)


def relative_path(upstreams: tuple[Upstream, ...], upstream_name: str, path: str) -> str | None:
    """`path` without the prefix of the upstream it went to (else of the one that serves it now)."""
    for upstream in upstreams:
        prefix = "" if upstream.prefix == "/" else upstream.prefix
        if upstream.name == upstream_name and path.startswith(prefix):
            rest = path[len(prefix) :]
            if rest[:1] in ("", "/"):
                return rest
    found = match_upstream(upstreams, path)
    return None if found is None else found[1]
