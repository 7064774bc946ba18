"""Export: the record, out to other tools, one exchange at a time.

Records come from `store.scan.stream_records` (a cursor, oldest first) and each is written as
soon as it is read, so an export of any size holds one batch of rows in memory.

- `jsonl`: one `show --json` object per line.
- `csv`: one row per exchange (`CSV_COLUMNS`); JSON values (tags, request, response) as JSON
  text, booleans as `true`/`false`, an empty cell for null, and text a spreadsheet would run
  as a formula (`=`, `+`, `-`, `@`, tab, CR first) behind a `'` (`spreadsheet_text`).
- `har`: HAR 1.2, one entry per exchange: the request as it went upstream (no key, no cookie:
  they are never stored), the response as the client got it (a stream's exact bytes when they
  were kept), timings (`wait` = time to upstream headers, `receive` = the rest).
- `batch`: OpenAI Batch API input lines (`custom_id` = exchange id, `method`, `url`, `body`)
  for one endpoint, streaming switched off, for a cheap bulk re-run.
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Callable
from http import HTTPStatus
from importlib import metadata
from typing import Any
from urllib.parse import parse_qsl

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.config import Upstream
from proxy.privacy.keep import redact_record
from proxy.privacy.redact import Redactor
from proxy.relay.paths import relative_path
from proxy.store.filters import Filters
from proxy.store.scan import stream_records
from proxy.text import spreadsheet_text

FORMATS = ("jsonl", "csv", "har", "batch")
BATCH_ENDPOINTS = (
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/completions",
    "/v1/responses",
    "/v1/moderations",
)
"""What the Batch API runs; one batch file holds requests for one of them."""
CSV_COLUMNS = (
    "id", "started_at", "method", "path", "query", "upstream", "status", "outcome", "error",
    "stream", "model", "response_model", "prompt_tokens", "completion_tokens", "total_tokens",
    "cost_usd", "price_entry", "ttfb_ms", "ttft_ms", "duration_ms", "chunks", "usage_source",
    "system_fingerprint", "upstream_request_id", "user", "key_hint", "replay_of", "tags",
    "request", "response",
)  # fmt: skip
_TOKEN_CELLS = [column for column in CSV_COLUMNS if column.endswith("_tokens")]
_JSON = orjson.OPT_NON_STR_KEYS

Write = Callable[[bytes], Any]


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return orjson.dumps(value, option=_JSON).decode()
    if isinstance(value, str):
        return spreadsheet_text(value)
    return str(value)


def csv_row(record: dict[str, Any]) -> list[str]:
    tokens = record.get("tokens") or {}
    values = {**record, **{k: tokens.get(k.removesuffix("_tokens")) for k in _TOKEN_CELLS}}
    return [_csv_cell(values[column]) for column in CSV_COLUMNS]


def _csv_line(cells: list[str] | tuple[str, ...]) -> bytes:
    out = io.StringIO()
    csv.writer(out).writerow(cells)
    return out.getvalue().encode()


def _stream_text(raw: bytes) -> str:
    if raw.startswith(b"\x1f\x8b"):  # the upstream compressed the stream; HAR wants it decoded
        raw = gzip.decompress(raw)
    return raw.decode("utf-8", "replace")


def _body_text(body: Any) -> tuple[str, str | None]:
    """(text, HAR encoding) of a stored body as `show --json` gives it."""
    if isinstance(body, str):
        return body, None
    if isinstance(body, dict) and set(body) == {"base64"}:
        return str(body["base64"]), "base64"
    return orjson.dumps(body, option=_JSON).decode(), None


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def _har_request(record: dict[str, Any]) -> dict[str, Any]:
    query = record["query"]
    url = record["upstream_url"] + (f"?{query}" if query else "")
    request: dict[str, Any] = {
        "method": record["method"],
        "url": url,
        "httpVersion": "HTTP/1.1",
        "cookies": [],
        "headers": [],
        "queryString": [{"name": k, "value": v} for k, v in parse_qsl(query)],
        "headersSize": -1,
        "bodySize": -1 if record["request_omitted"] else 0,
    }
    if record["request"] is not None:
        text, _ = _body_text(record["request"])
        mime = "application/json" if isinstance(record["request"], dict | list) else ""
        request["headers"] = [{"name": "Content-Type", "value": mime}] if mime else []
        request["postData"] = {"mimeType": mime, "text": text}
        request["bodySize"] = len(text.encode())
    return request


def _har_content(record: dict[str, Any]) -> dict[str, Any]:
    content: dict[str, Any] = {"size": record["response_bytes"], "mimeType": "", "text": ""}
    raw = record.get("raw_stream")
    if record["response_omitted"]:
        content["comment"] = "not stored (X-Flightrec-Omit, store_bodies or retention_bodies_days)"
    elif raw is not None:
        content.update(mimeType=record["content_type"] or "", text=_stream_text(raw))
    elif record["response"] is not None:
        text, encoding = _body_text(record["response"])
        content.update(mimeType=record["content_type"] or "", text=text)
        if encoding:
            content["encoding"] = encoding
        if record["stream"]:
            content["mimeType"] = "application/json"
            content["comment"] = "reassembled from the stream; its bytes were not kept"
    return content


def har_entry(record: dict[str, Any]) -> dict[str, Any]:
    status = record["status"] or 0
    headers = [{"name": "X-Flightrec-Id", "value": record["id"]}]
    if record["content_type"]:
        headers.append({"name": "Content-Type", "value": record["content_type"]})
    if record["upstream_request_id"]:
        headers.append({"name": "x-request-id", "value": record["upstream_request_id"]})
    wait = record["ttfb_ms"] or 0.0
    receive = max(0.0, (record["duration_ms"] or wait) - wait)
    return {
        "startedDateTime": record["started_at"],
        "time": wait + receive,
        "request": _har_request(record),
        "response": {
            "status": status,
            "statusText": _reason(status),
            "httpVersion": "HTTP/1.1",
            "cookies": [],
            "headers": headers,
            "content": _har_content(record),
            "redirectURL": "",
            "headersSize": -1,
            "bodySize": record["response_bytes"],
        },
        "cache": {},
        "timings": {"send": 0.0, "wait": wait, "receive": receive},
        "_flightrec": {
            key: record[key]
            for key in (
                "id",
                "outcome",
                "error",
                "upstream",
                "model",
                "usage",
                "cost_usd",
                "tags",
                "user",
                "replay_of",
                "redacted",
            )
        },
    }


def batch_line(
    record: dict[str, Any], upstreams: tuple[Upstream, ...], endpoint: str
) -> dict[str, Any] | None:
    """The Batch API input line re-running this exchange, or None if it is not a JSON POST to
    `endpoint`."""
    body = record["request"]
    if record["method"] != "POST" or not isinstance(body, dict):
        return None
    rest = relative_path(upstreams, record["upstream"], record["path"])
    if rest is None or "/v1" + rest != endpoint:
        return None
    body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    return {"custom_id": record["id"], "method": "POST", "url": endpoint, "body": body}


async def export(
    engine: AsyncEngine,
    write: Write,
    fmt: str,
    filters: Filters,
    *,
    upstreams: tuple[Upstream, ...],
    endpoint: str = BATCH_ENDPOINTS[0],
    redactor: Redactor | None = None,
) -> int:
    """Write the exchanges `filters` selects in `fmt`, redacted by `redactor` (the configured
    `[[redact]]` rules, so records stored before a rule existed come out clean); returns how
    many were written."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r} (known: {', '.join(FORMATS)})")
    if fmt == "csv":
        write(_csv_line(CSV_COLUMNS))
    elif fmt == "har":
        creator = {"name": "flightrec", "version": metadata.version("flightrec")}
        write(b'{"log":{"version":"1.2","creator":' + orjson.dumps(creator) + b',"entries":[\n')
    count = 0
    async for record in stream_records(engine, filters, raw_streams=fmt == "har"):
        if redactor is not None:
            redact_record(redactor, record)
        if fmt == "jsonl":
            write(orjson.dumps(record, option=_JSON) + b"\n")
        elif fmt == "csv":
            write(_csv_line(csv_row(record)))
        elif fmt == "har":
            write((b",\n" if count else b"") + orjson.dumps(har_entry(record), option=_JSON))
        else:
            line = batch_line(record, upstreams, endpoint)
            if line is None:
                continue
            write(orjson.dumps(line, option=_JSON) + b"\n")
        count += 1
    if fmt == "har":
        write(b"\n]}}\n")
    return count
