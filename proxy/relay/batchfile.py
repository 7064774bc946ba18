"""A Batch API file download on its way to the client: its result lines to the record.

For `GET .../files/{id}/content` answered 200, the tee's reader is given a `ResultLines`
(`stream/batchfile.py`) that turns each result line into an exchange as the body passes; the
exchange gets what the download's request says of the record (the key that downloaded it, its
tags and user, what to omit) and goes to the sinks as any exchange does (kept or redacted by
`Keep`, journaled, then booked once by the writer). The client's bytes are not touched.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from proxy.exchange import Exchange
from proxy.relay.headers import control_headers, key_identity
from proxy.sinks.fanout import Sinks
from proxy.stream.batchfile import ResultLines, content_file
from proxy.stream.reader import LineReader


def result_lines(
    method: str, path: str, status: int, headers: Any, sinks: Sinks, max_line_bytes: int
) -> Callable[[Exchange], LineReader] | None:
    """What makes the line reader of a file download's body; None for any other answer."""
    found = content_file(method, path)
    if found is None or status != 200:
        return None
    prefix, file_id = found
    controls = control_headers(headers)
    key_hash, key_hint = key_identity(headers)

    def emit(result: Exchange) -> None:
        result.tags = dict(controls.tags)
        result.user = controls.user
        result.omit_request = controls.omit_request
        result.omit_response = controls.omit_response
        result.key_hash, result.key_hint = key_hash, key_hint
        sinks.accept(result)

    return functools.partial(
        ResultLines, prefix=prefix, file_id=file_id, emit=emit, max_line_bytes=max_line_bytes
    )
