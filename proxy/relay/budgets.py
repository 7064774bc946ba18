"""The relay's budget check: which spent `action = "block"` budget, if any, a request is in.

`Blocked.budgets` is kept by the background evaluation (`proxy.alerts.watch`); the relay only
reads it.
While no blocking budget is spent it is empty and a request costs one attribute read; while
one is, the request's key, user, tags and model are read from what the relay already has
(headers, the body it read) with no database query.
"""

from __future__ import annotations

from typing import Any

import orjson
from multidict import CIMultiDictProxy

from proxy.alert_rules import Blocked, Budget, Scope
from proxy.relay.headers import control_headers, key_identity


def _body_field(body: bytes, name: str) -> str | None:
    if body.lstrip()[:1] != b"{":
        return None
    try:
        payload: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    value = payload.get(name) if isinstance(payload, dict) else None
    return value if isinstance(value, str) else None


def _in_scope(scope: Scope, headers: CIMultiDictProxy[str], body: bytes) -> bool:
    if scope.kind == "key":
        key_hash, key_hint = key_identity(headers)
        if key_hash is None:
            return False
        return key_hint == scope.value or key_hash.startswith(scope.value.lower())
    if scope.kind == "tag":
        return control_headers(headers).tags.get(scope.tag or "") == scope.value
    if scope.kind == "user":  # as the record names the user: the header first, then the body
        user = control_headers(headers).user
        if user is None:
            user = _body_field(body, "user") or _body_field(body, "safety_identifier")
        return user == scope.value
    return _body_field(body, "model") == scope.value


def over_budget(blocked: Blocked, headers: CIMultiDictProxy[str], body: bytes) -> Budget | None:
    """The first spent blocking budget the request falls in, or None."""
    for budget in blocked.budgets:
        if _in_scope(budget.scope, headers, body):
            return budget
    return None
