"""The Batch API's traffic into rows (SPEC 12): pure, no I/O.

A batch's story passes through the proxy in ordinary exchanges, each read here from what the
record kept of it:

- the upload of an input file (`POST /files`, purpose `batch`): its lines, by file and
  `custom_id` (`batch_requests`);
- a batch object in an answer (`POST /batches`, `GET /batches/{id}`, a cancel, a list): the
  batch as seen then (`batches`), which names its input, output and error files;
- a file's content passing through (`GET /files/{id}/content`): an input file's lines, as for
  an upload (an output or error file's result lines are exchanges of their own, made as the
  file passes: `stream/batchfile.py`; `booking_row` is the row that books each once).

Which batch a result belongs to and which request line it answers may not be known by the
process that sees the file (the batch was seen by another process, or is seen later): the
writer links them in the database (`batch_sql`), whenever either side arrives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from proxy.exchange import Exchange
from proxy.store.engine import dumps
from proxy.stream.batchfile import content_file, is_result, lines, text, when

Row = dict[str, Any]


@dataclass(slots=True)
class BatchRows:
    """What one exchange says of batches."""

    requests: list[Row] = field(default_factory=list)
    batches: list[Row] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    """File ids whose results may be linked to their batch and request lines once written."""

    def __bool__(self) -> bool:
        return bool(self.requests or self.batches or self.files)


def batch_rows(ex: Exchange) -> BatchRows | None:
    """What `ex` says of batches; None for an exchange that is no part of one."""
    if ex.status != 200 or ex.omit_response:
        return None
    response = ex.response_json
    download = content_file(ex.method, ex.path)
    if download is not None:
        return _input_file(ex, download[1])
    if isinstance(response, dict):
        if ex.method == "POST" and ex.path.endswith("/files"):
            return _upload(ex, response)
        seen = [response] if response.get("object") == "batch" else _listed(response)
        if not seen:  # nearly every exchange: no comprehension to build for nothing
            return None
        batches = [_batch(ex, b) for b in seen if _is_batch(b)]
        if batches:
            names = ("input_file_id", "output_file_id", "error_file_id")
            files = [row[name] for row in batches for name in names if row[name]]
            return BatchRows(batches=batches, files=files)
    return None


def _listed(response: dict[str, Any]) -> list[Any]:
    data = response.get("data")
    if response.get("object") != "list" or not isinstance(data, list):
        return []
    return [item for item in data if isinstance(item, dict) and item.get("object") == "batch"]


def _is_batch(found: Any) -> bool:
    return isinstance(found, dict) and isinstance(found.get("id"), str)


def _batch(ex: Exchange, found: dict[str, Any]) -> Row:
    counts = found.get("request_counts")
    return {
        "id": found["id"],
        "status": text(found.get("status")),
        "endpoint": text(found.get("endpoint")),
        "input_file_id": text(found.get("input_file_id")),
        "output_file_id": text(found.get("output_file_id")),
        "error_file_id": text(found.get("error_file_id")),
        "created_at": when(found.get("created_at")),
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
        if not isinstance(custom_id, str) or custom_id in rows or is_result(line):
            continue
        body = line.get("body")
        model = body.get("model") if isinstance(body, dict) else None
        rows[custom_id] = {
            "input_file_id": file_id,
            "custom_id": text(custom_id),
            "line": number,
            "method": text(line.get("method")),
            "url": text(line.get("url")),
            "model": text(model),
            "body": None if body is None else dumps(body),
            "exchange_id": ex.id,
        }
    return list(rows.values())


def _input_file(ex: Exchange, file_id: str) -> BatchRows | None:
    """An input file's content downloaded: its request lines, as for an upload (result lines
    are read as the file passes, not here)."""
    body = ex.response_body
    if not body:
        return None
    requests = _requests(ex, file_id, body)
    if not requests:
        return None
    return BatchRows(requests=requests, files=[file_id])


def booking_row(exchange_id: str, line: dict[str, Any]) -> Row:
    """The `batch_results` row of a result line's exchange (`Exchange.batch_line`)."""
    booked = line.get("booked_at")
    return {
        "line_id": str(line.get("line_id")),
        "file_id": str(line.get("file_id")),
        "batch_id": None,
        "custom_id": text(line.get("custom_id")),
        "exchange_id": exchange_id,
        "booked_at": datetime.fromtimestamp(booked if isinstance(booked, float | int) else 0, UTC),
    }


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
