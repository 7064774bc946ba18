"""What is kept of an exchange's bodies: the policy both the journal and the rows follow."""

from __future__ import annotations

from typing import Any, NamedTuple

from proxy.exchange import Exchange


class Bodies(NamedTuple):
    """What is kept of the bodies: JSON when they parse, raw bytes otherwise, nothing if omitted."""

    request: Any
    request_body: bytes | None
    response: Any
    response_body: bytes | None
    raw_stream_gz: bytes | None


def stored_bodies(ex: Exchange) -> Bodies:
    request, request_body = (None, None)
    if not ex.omit_request:
        request = ex.request_json
        request_body = ex.request_body if request is None else None
    response, response_body, raw_stream_gz = (None, None, None)
    if not ex.omit_response:
        response = ex.response_json
        response_body = ex.response_body if response is None else None
        raw_stream_gz = ex.raw_stream_gz
    # tuple.__new__: a NamedTuple's own __new__ is a Python function, and this runs twice a record.
    return _new(Bodies, (request, request_body, response, response_body, raw_stream_gz))


_new = tuple.__new__
