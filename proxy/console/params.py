"""Query strings into store filters, for the API and the pages alike.

Every problem is a `BadParam` naming the parameter, which the API answers with 400 and
`{"error": {"message", "type", "param"}}`. An empty value is the same as no value, so a GET
form with blank fields is a valid query.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from multidict import MultiMapping

from proxy.keynames import KeyNames
from proxy.store import sorting
from proxy.store.browse import MAX_LIMIT, OUTCOMES, ListFilters, decode_cursor
from proxy.store.cost import parse_by
from proxy.store.filters import Filters
from proxy.store.read import parse_since, parse_tag
from proxy.store.series import parse_bucket

T = TypeVar("T")
Query = MultiMapping[str]

COST_PARAMS = frozenset({"since", "until", "model", "key", "tag"})
LIST_PARAMS = COST_PARAMS | {
    "outcome", "status", "user", "upstream", "fingerprint", "replay_of", "session", "q", "limit",
    "cursor", "sort",
}  # fmt: skip
OVERVIEW_PARAMS = LIST_PARAMS - {"limit", "cursor", "sort"}


class BadParam(ValueError):
    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


def _one(query: Query, name: str, parse: Callable[[str], T]) -> T | None:
    values = [v for v in query.getall(name, []) if v.strip()]
    if not values:
        return None
    if len(values) > 1:
        raise BadParam(name, "give it once")
    try:
        return parse(values[0].strip())
    except ValueError as exc:
        raise BadParam(name, str(exc)) from None


def _status(text: str) -> int:
    """A status, or a class of them as 400 / 500 times -1: `4xx`, `5xx`."""
    if text.lower() in ("4xx", "5xx"):
        return -int(text[0])
    if not text.isdigit() or not 100 <= int(text) <= 599:
        raise ValueError(f"expected an HTTP status 100-599, 4xx or 5xx, got {text!r}")
    return int(text)


def _outcome(text: str) -> str:
    if text not in (*OUTCOMES, "error"):
        raise ValueError(f"expected one of {', '.join(OUTCOMES)} or error, got {text!r}")
    return text


def _limit(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise ValueError(f"expected a number from 1 to {MAX_LIMIT}, got {text!r}")
    return int(text)


def _cursor(text: str) -> str:
    try:
        decode_cursor(text)
    except ValueError:
        sorting.decode(text)  # a cursor of another order, or a ValueError
    return text


def check_known(query: Query, known: frozenset[str]) -> None:
    for name in query:
        if name not in known:
            raise BadParam(name, f"unknown parameter (known: {', '.join(sorted(known))})")


def cost_filters(query: Query, names: KeyNames | None = None) -> Filters:
    """since, until, model, key, tag (repeatable): what `flightrec cost` takes."""
    tags = []
    for value in query.getall("tag", []):
        if value.strip():
            try:
                tags.append(parse_tag(value))
            except ValueError as exc:
                raise BadParam("tag", str(exc)) from None
    since = _one(query, "since", parse_since)
    until = _one(query, "until", parse_since)
    if since is not None and until is not None and since >= until:
        raise BadParam("until", "must be later than since")
    key = _one(query, "key", str)
    if key is not None and names is not None:
        key = names.resolve(key)
    return Filters(since, until, _one(query, "model", str), key, tuple(tags))


def list_filters(query: Query, names: KeyNames | None = None) -> ListFilters:
    status = _one(query, "status", _status)
    return ListFilters(
        base=cost_filters(query, names),
        outcome=_one(query, "outcome", _outcome),
        status=None if status is None or status < 0 else status,
        status_class=None if status is None or status > 0 else -status,
        user=_one(query, "user", str),
        upstream=_one(query, "upstream", str),
        fingerprint=_one(query, "fingerprint", str),
        replay_of=_one(query, "replay_of", str),
        session=_one(query, "session", str),
        q=_one(query, "q", str),
    )


def page(query: Query, default_limit: int = 50) -> tuple[int, str | None]:
    """(limit, cursor) of a list request."""
    return _one(query, "limit", _limit) or default_limit, _one(query, "cursor", _cursor)


def sort(query: Query) -> str:
    return _one(query, "sort", sorting.parse_sort) or "newest"


def by(query: Query, default: str = "model") -> str:
    return _one(query, "by", parse_by) or default


def bucket(query: Query, default: str = "day") -> str:
    return _one(query, "bucket", parse_bucket) or default


def plain(query: Query, names: frozenset[str]) -> list[tuple[str, Any]]:
    """The non-empty parameters among `names`, in order: to build links that keep a view."""
    return [(k, v) for k, v in query.items() if k in names and v.strip()]
