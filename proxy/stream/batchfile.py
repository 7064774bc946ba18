"""Batch API files as they pass (SPEC 12): JSONL read line by line, each result line of an output
or error file made into the exchange that books it.

`ResultLines` reads a file's content piece by piece as the record reads the body (after the
client has the bytes): it keeps only the line not yet ended, never the file, so a file of any
size is read in bounded memory. Each whole line that is a result (`{"id": "batch_req_...",
"custom_id", "response": {"status_code", "request_id", "body"}, "error"}`) becomes an
`Exchange` (`result_exchange`) handed to `emit` at once; its `batch_line` names the key the
writer books it by, once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import orjson

from proxy.exchange import Exchange, format_id

CONTENT = re.compile(r"^(.*)/files/([^/]+)/content$")
"""`GET <prefix>/files/{file_id}/content`."""
_PATHS = {
    "chat.completion": "/chat/completions",
    "response": "/responses",
    "text_completion": "/completions",
    "list": "/embeddings",
}
"""Where a result's body came from, by its `object`, until its request line says."""
_EARLIEST = 1_500_000_000
"""A `created` time before this (2017) is not one: the result is dated by its download."""


def content_file(method: str, path: str) -> tuple[str, str] | None:
    """(path prefix, file id) of a file content download; None for any other request."""
    found = CONTENT.match(path) if method == "GET" else None
    return None if found is None else (found.group(1), found.group(2))


def when(value: Any) -> datetime | None:
    """A Unix time a Batch API object gives, as a UTC time; None if it is not one."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= _EARLIEST:
        try:
            return datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError):
            return None
    return None


def text(value: Any) -> str | None:
    """A string for a text column (PostgreSQL text cannot hold NUL); None for a non-string."""
    if not isinstance(value, str):
        return None
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


def lines(content: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number from 1, object) for each line of a JSONL text that holds a JSON object;
    read line by line, never split into a list of them all."""
    start, number, size = 0, 0, len(content)
    while start < size:
        end = content.find(b"\n", start)
        end = size if end == -1 else end
        number += 1
        found = _parsed(content[start:end])
        start = end + 1
        if found is not None:
            yield number, found


def _parsed(line: bytes) -> dict[str, Any] | None:
    if not line.strip():
        return None
    try:
        found = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None


def is_result(line: dict[str, Any]) -> bool:
    return "custom_id" in line and ("response" in line or "error" in line)


class ResultLines:
    """Reads a downloaded file's content as it passes; `emit` gets each result line's exchange.

    `download` is the download's exchange (its upstream, and its time for a result that does
    not say when it ran); `fill` completes each result exchange with what the download's
    request says (key, tags, what to omit). A line longer than `max_line_bytes` is skipped and
    said in the download's `parse_errors`.
    """

    def __init__(
        self,
        download: Exchange,
        prefix: str,
        file_id: str,
        emit: Callable[[Exchange], None],
        *,
        max_line_bytes: int,
    ) -> None:
        self._download = download
        self._prefix = prefix
        self._file_id = file_id
        self._emit = emit
        self._max = max_line_bytes
        self._tail = bytearray()
        self._skipping = False
        """The line being read is too long: it is dropped up to its end."""
        self.number = 0
        """Lines read so far."""
        self.results = 0

    def feed(self, data: bytes) -> None:
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end == -1:
                self._keep(data[start:])
                return
            self._keep(data[start:end])
            self._line()
            start = end + 1

    def end(self) -> None:
        """The body has ended: its last line, if it had no newline."""
        if self._tail or self._skipping:
            self._line()

    def _keep(self, part: bytes) -> None:
        if self._skipping or not part:
            return
        if len(self._tail) + len(part) > self._max:
            self._skipping = True
            self._tail.clear()
            return
        self._tail += part

    def _line(self) -> None:
        self.number += 1
        if self._skipping:
            self._skipping = False
            errors = self._download.parse_errors
            if len(errors) < 20:
                errors.append(f"batch file line {self.number} longer than max_record_bytes")
            return
        found = _parsed(bytes(self._tail))
        self._tail.clear()
        if found is not None and is_result(found):
            self.results += 1
            self._emit(
                result_exchange(self._download, self._prefix, self._file_id, self.number, found)
            )


def result_exchange(
    download: Exchange, prefix: str, file_id: str, number: int, line: dict[str, Any]
) -> Exchange:
    """The exchange that books one result line: its response, usage and status; dated when the
    response body says it was made (else by the download); `batch_line` is its key."""
    found = line.get("response")
    response: dict[str, Any] = found if isinstance(found, dict) else {}
    found = response.get("body")
    body: dict[str, Any] = found if isinstance(found, dict) else {}
    made = when(body.get("created")) or when(body.get("created_at"))
    at = made.timestamp() if made is not None else download.started_at
    ex = Exchange.start(
        "POST",
        prefix + _PATHS.get(str(body.get("object")), "/batches"),
        "",
        download.upstream,
        exchange_id=format_id(int(at * 1000) << 12 | number & 0xFFF),
        started_at=at,
    )
    ex.upstream_url = download.upstream_url
    status = response.get("status_code")
    ex.status = status if isinstance(status, int) and not isinstance(status, bool) else None
    ex.content_type = "application/json"
    ex.response_json = body or None
    ex.upstream_request_id = text(response.get("request_id"))
    ex.response_model = text(body.get("model"))
    ex.system_fingerprint = text(body.get("system_fingerprint"))
    usage = body.get("usage")
    ex.usage = usage if isinstance(usage, dict) else None
    ex.usage_source = "reported" if ex.usage is not None else None
    ex.batch = True  # priced at batch rates when it is settled
    custom_id = text(line.get("custom_id"))
    ex.batch_line = {
        "line_id": text(line.get("id")) or f"{file_id}:{custom_id}",
        "file_id": file_id,
        "custom_id": custom_id,
        "booked_at": download.started_at,
    }
    _failed(ex, line.get("error"), body.get("error"))
    return ex


def _failed(ex: Exchange, error: Any, body_error: Any) -> None:
    """A line with an `error`, or whose response failed, is a failed exchange."""
    found = error if error is not None else body_error
    if found is None and (ex.status is None or ex.status < 400):
        return
    message = found.get("message") if isinstance(found, dict) else None
    if isinstance(message, str):
        ex.report("upstream_error", message)
    elif found is not None:
        ex.report("upstream_error", orjson.dumps(found).decode())
    else:
        ex.report("upstream_error", f"batch request failed with status {ex.status}")
