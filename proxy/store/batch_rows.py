"""The Batch API's traffic into rows (SPEC 12): pure, no I/O.

A batch's story passes through the proxy in ordinary exchanges, each read here from what the
record kept of it:

- the upload of an input file (`POST /files`, purpose `batch`): its lines, by file and
  `custom_id` (`batch_requests`);
- a batch object in an answer (`POST /batches`, `GET /batches/{id}`, a cancel, a list): the
  batch as seen then (`batches`), which names its input, output and error files;
- a file's content passing through (`GET /files/{id}/content`): for an output or error file,
  one exchange per result line, with the key that books it once (`batch_results`); for an
  input file, its lines, as for an upload.

Which batch a result belongs to and which request line it answers may not be known by the
process that sees the file (the batch was seen by another process, or is seen later): the
writer links them in the database (`batch_sql`), whenever either side arrives.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from proxy.exchange import Exchange, format_id
from proxy.store.engine import dumps

Row = dict[str, Any]
_CONTENT = re.compile(r"^(.*)/files/([^/]+)/content$")
_UPLOAD = re.compile(r"^(.*)/files$")
_PATHS = {
    "chat.completion": "/chat/completions",
    "response": "/responses",
    "text_completion": "/completions",
    "list": "/embeddings",
}
"""Where a result's body came from, by its `object`, until its request line says."""
_EARLIEST = 1_500_000_000
"""A `created` time before this (2017) is not one: the result is dated by its download."""


@dataclass(slots=True)
class Result:
    """One result line of an output or error file, as the exchange that books it."""

    key: Row
    """Its `batch_results` row: booked when the line's id is not there yet."""
    exchange: Exchange


@dataclass(slots=True)
class BatchRows:
    """What one exchange says of batches."""

    requests: list[Row] = field(default_factory=list)
    batches: list[Row] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    """File ids whose results may be linked to their batch and request lines once written."""

    def __bool__(self) -> bool:
        return bool(self.requests or self.batches or self.results or self.files)


def batch_rows(ex: Exchange) -> BatchRows | None:
    """What `ex` says of batches; None for an exchange that is no part of one."""
    if ex.status != 200 or ex.omit_response:
        return None
    path = ex.path
    response = ex.response_json
    if ex.method == "GET" and (found := _CONTENT.match(path)):
        return _content(ex, found.group(1), found.group(2))
    if isinstance(response, dict):
        if ex.method == "POST" and _UPLOAD.match(path):
            return _upload(ex, response)
        seen = [response] if response.get("object") == "batch" else _listed(response)
        if seen:
            found_rows = BatchRows(batches=[_batch(ex, b) for b in seen if _is_batch(b)])
            for row in found_rows.batches:
                found_rows.files += [row["input_file_id"], row["output_file_id"]]
                found_rows.files.append(row["error_file_id"])
            found_rows.files = [f for f in found_rows.files if f]
            return found_rows or None
    return None


def _listed(response: dict[str, Any]) -> list[Any]:
    data = response.get("data")
    if response.get("object") != "list" or not isinstance(data, list):
        return []
    return [item for item in data if isinstance(item, dict) and item.get("object") == "batch"]


def _is_batch(found: Any) -> bool:
    return isinstance(found, dict) and isinstance(found.get("id"), str)


def _text(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


def _time(value: Any) -> datetime | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= _EARLIEST:
        try:
            return datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError):
            return None
    return None


def _batch(ex: Exchange, found: dict[str, Any]) -> Row:
    counts = found.get("request_counts")
    return {
        "id": found["id"],
        "status": _text(found.get("status")),
        "endpoint": _text(found.get("endpoint")),
        "input_file_id": _text(found.get("input_file_id")),
        "output_file_id": _text(found.get("output_file_id")),
        "error_file_id": _text(found.get("error_file_id")),
        "created_at": _time(found.get("created_at")),
        "seen_at": datetime.fromtimestamp(ex.started_at, UTC),
        "request_counts": dumps(counts) if isinstance(counts, dict) else None,
        "exchange_id": ex.id,
    }


def _upload(ex: Exchange, response: dict[str, Any]) -> BatchRows | None:
    file_id = response.get("id")
    if response.get("purpose") != "batch" or not isinstance(file_id, str):
        return None
    content = file_part(ex.request_body or b"")
    if content is None:
        return None
    return BatchRows(requests=_requests(ex, file_id, content), files=[file_id])


def _requests(ex: Exchange, file_id: str, content: bytes) -> list[Row]:
    """The request lines of an input file, each `custom_id` once (the first)."""
    rows: dict[str, Row] = {}
    for number, line in lines(content):
        custom_id = line.get("custom_id")
        if not isinstance(custom_id, str) or custom_id in rows:
            continue
        body = line.get("body")
        model = body.get("model") if isinstance(body, dict) else None
        rows[custom_id] = {
            "input_file_id": file_id,
            "custom_id": _text(custom_id),
            "line": number,
            "method": _text(line.get("method")),
            "url": _text(line.get("url")),
            "model": _text(model),
            "body": None if body is None else dumps(body),
            "exchange_id": ex.id,
        }
    return list(rows.values())


def _content(ex: Exchange, prefix: str, file_id: str) -> BatchRows | None:
    """A file's content: result lines (an output or error file) or request lines."""
    body = ex.response_body
    if body is None and isinstance(ex.response_json, dict):  # a one-line file read as JSON
        body = orjson.dumps(ex.response_json)
    if not body:
        return None
    found = BatchRows(files=[file_id])
    requests: list[Row] = []
    for number, line in lines(body):
        if "custom_id" not in line:
            continue
        if "response" in line or "error" in line:
            result = _result(ex, prefix, file_id, number, line)
            if result is not None:
                found.results.append(result)
        elif "body" in line:
            requests.append(line)
    if requests and not found.results:
        text = b"\n".join(orjson.dumps(line) for line in requests)
        found.requests = _requests(ex, file_id, text)
    return found if found.results or found.requests else None


def lines(content: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number from 1, object) for each line of a JSONL text that holds a JSON object;
    read line by line, never split into a list of them all."""
    start, number, size = 0, 0, len(content)
    while start < size:
        end = content.find(b"\n", start)
        end = size if end == -1 else end
        number += 1
        text = content[start:end]
        start = end + 1
        if not text.strip():
            continue
        try:
            found = orjson.loads(text)
        except orjson.JSONDecodeError:
            continue
        if isinstance(found, dict):
            yield number, found


def file_part(body: bytes) -> bytes | None:
    """The content of the `file` part of a multipart/form-data body; None if it has none.

    The boundary is read from the body's first line, so no header is needed: the record keeps
    the body, not the request's Content-Type."""
    if not body.startswith(b"--"):
        return None
    first = body.find(b"\r\n")
    if first <= 2:
        return None
    delimiter = b"\r\n" + body[:first]
    start = first + 2
    while start < len(body):
        head_end = body.find(b"\r\n\r\n", start)
        if head_end == -1:
            return None
        end = body.find(delimiter, head_end + 4)
        head = body[start:head_end].lower()
        if b'name="file"' in head and b"filename" in head:
            return body[head_end + 4 : len(body) if end == -1 else end]
        if end == -1:
            return None
        start = end + len(delimiter) + 2
    return None


def _result(
    download: Exchange, prefix: str, file_id: str, number: int, line: dict[str, Any]
) -> Result | None:
    custom_id = _text(line.get("custom_id"))
    found = line.get("response")
    response: dict[str, Any] = found if isinstance(found, dict) else {}
    found = response.get("body")
    body: dict[str, Any] | None = found if isinstance(found, dict) else None
    started = _time((body or {}).get("created")) or _time((body or {}).get("created_at"))
    at = started.timestamp() if started is not None else download.started_at
    place = int(at * 1000) << 12 | number & 0xFFF
    ex = Exchange.start(
        "POST",
        prefix + _PATHS.get(str((body or {}).get("object")), "/batches"),
        "",
        download.upstream,
        exchange_id=format_id(place),
        started_at=at,
    )
    ex.upstream_url = download.upstream_url
    ex.status = (
        response.get("status_code") if isinstance(response.get("status_code"), int) else None
    )
    ex.content_type = "application/json"
    ex.response_json = body
    ex.upstream_request_id = _text(response.get("request_id"))
    ex.key_hash, ex.key_hint, ex.tags = download.key_hash, download.key_hint, dict(download.tags)
    if body is not None:
        ex.response_model = _text(body.get("model"))
        ex.system_fingerprint = _text(body.get("system_fingerprint"))
        usage = body.get("usage")
        ex.usage = usage if isinstance(usage, dict) else None
        ex.usage_source = "reported" if ex.usage is not None else None
    _outcome(ex, line.get("error"), body)
    line_id = _text(line.get("id")) or f"{file_id}:{custom_id}"
    key = {
        "line_id": line_id,
        "file_id": file_id,
        "batch_id": None,
        "custom_id": custom_id,
        "exchange_id": ex.id,
        "booked_at": datetime.fromtimestamp(download.started_at, UTC),
    }
    return Result(key, ex)


def _outcome(ex: Exchange, error: Any, body: dict[str, Any] | None) -> None:
    """A line with an `error`, or whose response failed, is a failed exchange."""
    found = error if error is not None else (body or {}).get("error")
    if found is None and (ex.status is None or ex.status < 400):
        return
    ex.outcome = "upstream_error"
    message = found.get("message") if isinstance(found, dict) else None
    if isinstance(message, str):
        ex.error = message
    elif found is not None:
        ex.error = orjson.dumps(found).decode()
    else:
        ex.error = f"batch request failed with status {ex.status}"
