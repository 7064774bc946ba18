"""`export`: JSONL, CSV, HAR and Batch API input, checked by reading them back with the tools
they are for (csv, haralyzer, the Batch API input shape)."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from haralyzer import HarParser  # type: ignore[import-untyped]

from proxy.exchange import Exchange
from proxy.store import upgrade
from proxy.store.filters import Filters
from proxy.store.read import get_exchange, reading
from proxy.store.scan import stream_records
from proxy.tools.export import CSV_COLUMNS, export
from tests import dbs
from tests.conftest import FakeUpstream
from tests.dbs import chat_exchange
from tests.dbs import recorded as write
from tests.recordings import MESSAGES, Recorded, answer_by_model, cli, config_for, record_two

db_url = dbs.db_url  # fixture
BATCH_KEYS = {"custom_id", "method", "url", "body"}


def embedding_exchange() -> Exchange:
    ex = Exchange.start("POST", "/v1/embeddings", "", "openai")
    ex.upstream_url = "https://api.openai.com/v1/embeddings"
    ex.model = "text-embedding-3-small"
    ex.request_json = {"model": ex.model, "input": "hello"}
    ex.response_json = {"object": "list", "data": [{"embedding": [0.5]}], "usage": {}}
    ex.status, ex.content_type = 200, "application/json"
    return ex


def failed_exchange() -> Exchange:
    ex = chat_exchange(model="gpt-4o", tags={"team": "search", "env": "ci"}, user="u-1")
    ex.status, ex.outcome, ex.error = 500, "upstream_error", 'boom, "quoted"\nand a newline'
    ex.response_json, ex.content_type = None, "text/plain"
    ex.response_body = b"Internal Server Error"
    ex.usage = ex.usage_source = ex.response_model = None
    ex.query = "api-version=2024-06-01&x=1"
    return ex


async def recorded_mix(upstream: FakeUpstream, url: str, tmp_path: Path) -> Recorded:
    """A stream and a plain completion through the real proxy, then a failed tagged chat
    completion and an embedding written as the recorder writes them."""
    answer_by_model(upstream)
    recorded = await record_two(config_for(url, upstream.url, tmp_path))
    await write(url, [failed_exchange(), embedding_exchange()])
    return recorded


def _cell(text: str, like: Any) -> Any:
    """A CSV cell read back as the type of the JSONL value it stands for."""
    if text == "":
        return "" if like == "" else None  # an empty cell: null, or an empty query string
    if isinstance(like, bool):
        return {"true": True, "false": False}[text]
    if isinstance(like, int):
        return int(text)
    if isinstance(like, float):
        return float(text)
    if isinstance(like, dict | list):
        return orjson.loads(text)
    return text


@pytest.fixture
async def mix(upstream: FakeUpstream, db_url: str, tmp_path: Path) -> Mix:
    recorded = await recorded_mix(upstream, db_url, tmp_path)
    env = {"FLIGHTREC_DB_URL": db_url}
    run = await cli("export", env=env, cwd=tmp_path)
    assert run.code == 0, run.err
    records = [orjson.loads(line) for line in run.out.splitlines()]
    return Mix(recorded, env, records, upstream.url, db_url)


@dataclass
class Mix:
    recorded: Recorded
    env: dict[str, str]
    records: list[dict[str, Any]]
    """What `export` (JSONL, the default) printed."""
    upstream_url: str
    db_url: str


async def test_jsonl_is_show_json_per_line_oldest_first(mix: Mix) -> None:
    records = mix.records
    assert len(records) == 4
    assert [r["id"] for r in records[:2]] == [mix.recorded.stream_id, mix.recorded.plain_id]
    async with reading(mix.db_url) as engine:
        for record in records:
            assert record == await get_exchange(engine, record["id"])


async def test_csv_cells_read_back_to_the_jsonl_values(mix: Mix, tmp_path: Path) -> None:
    run = await cli("export", "--format", "csv", env=mix.env, cwd=tmp_path)
    assert run.code == 0, run.err
    rows = list(csv.DictReader(io.StringIO(run.out, newline="")))
    assert tuple(rows[0]) == CSV_COLUMNS and len(rows) == 4
    for row, record in zip(rows, mix.records, strict=True):
        usage = record["usage"] or {}
        for column in CSV_COLUMNS:
            expected = usage.get(column) if column.endswith("_tokens") else record[column]
            assert _cell(row[column], expected) == expected, column


async def test_har_is_read_by_haralyzer(mix: Mix, tmp_path: Path) -> None:
    records = mix.records
    har_path = tmp_path / "out.har"
    run = await cli("export", "--format", "har", "-o", str(har_path), env=mix.env, cwd=tmp_path)
    assert run.code == 0 and "exported 4 exchanges" in run.err, run.err
    parser = HarParser(json.loads(har_path.read_text()))
    assert parser.version == "1.2" and parser.creator["name"] == "flightrec"
    [page] = parser.pages
    entries = page.entries
    assert len(entries) == 4
    stream, plain, failed, _embedding = entries
    assert stream.request.method == "POST"
    assert stream.request.url == mix.upstream_url + "/chat/completions"
    assert orjson.loads(stream.request.text) == records[0]["request"]
    assert stream.response.text.encode() == mix.recorded.stream_bytes
    assert stream.response.mimeType.startswith("text/event-stream")
    assert orjson.loads(plain.response.text) == records[1]["response"]
    assert stream.startTime is not None and stream.timings["wait"] == records[0]["ttfb_ms"]
    assert stream.time == pytest.approx(records[0]["duration_ms"])
    assert (failed.status, failed.response.text) == (500, "Internal Server Error")
    assert failed.request.queryString == [
        {"name": "api-version", "value": "2024-06-01"},
        {"name": "x", "value": "1"},
    ]
    assert "sk-" not in har_path.read_text()  # keys are never stored, so never exported


async def test_batch_input_holds_chat_completions_without_streaming(
    mix: Mix, tmp_path: Path
) -> None:
    run = await cli("export", "--format", "batch", env=mix.env, cwd=tmp_path)
    assert run.code == 0, run.err
    lines = [orjson.loads(line) for line in run.out.splitlines()]
    assert [line["custom_id"] for line in lines] == [r["id"] for r in mix.records[:3]]
    for line in lines:
        assert set(line) == BATCH_KEYS and line["method"] == "POST"
        assert line["url"] == "/v1/chat/completions"
        assert isinstance(line["body"]["model"], str) and line["body"]["messages"]
        assert "stream" not in line["body"] and "stream_options" not in line["body"]
    assert lines[0]["body"] == {"model": "gpt-4o-mini", "messages": MESSAGES}

    run = await cli("export", "--format", "batch", "--endpoint", "/v1/embeddings", env=mix.env)
    assert [orjson.loads(line)["url"] for line in run.out.splitlines()] == ["/v1/embeddings"]
    run = await cli("export", "--format", "batch", "--endpoint", "/v1/nope", env=mix.env)
    assert run.code == 2 and "--endpoint" in run.err and "Traceback" not in run.err


async def test_filters(upstream: FakeUpstream, tmp_path: Path) -> None:
    url = dbs.sqlite_url(tmp_path / "e.db")
    old = chat_exchange(started_at=1_700_000_000.0)  # 2023-11-14
    await upgrade(url)
    await write(url, [old])
    await recorded_mix(upstream, url, tmp_path)
    env = {"FLIGHTREC_DB_URL": url}

    async def ids(*args: str) -> list[str]:
        run = await cli("export", *args, env=env)
        assert run.code == 0, run.err
        return [orjson.loads(line)["id"] for line in run.out.splitlines()]

    everything = await ids()
    assert len(everything) == 5 and everything[0] == old.id
    assert await ids("--until", "2024-01-01") == [old.id]
    assert await ids("--since", "2024-01-01") == everything[1:]
    assert await ids("--tag", "team=search", "--tag", "env=ci") == [everything[3]]
    assert await ids("--model", "text-embedding-3-small") == [everything[4]]
    assert await ids("--limit", "2") == everything[:2]
    run = await cli("export", "--since", "1d", "--until", "2d", env=env)
    assert run.code == 2 and "--since must be earlier" in run.err


async def test_large_exports_stream_in_batches(db_url: str) -> None:
    exchanges = [
        chat_exchange(started_at=1_700_000_000.0 + i, tags={"n": str(i)}) for i in range(1200)
    ]
    await upgrade(db_url)
    await write(db_url, exchanges)
    async with reading(db_url) as engine:
        seen = [r async for r in stream_records(engine, Filters(), batch=100)]
        assert [r["id"] for r in seen] == [ex.id for ex in exchanges]
        assert [r["tags"] for r in seen] == [{"n": str(i)} for i in range(1200)]
        out: list[bytes] = []
        count = await export(engine, out.append, "jsonl", Filters(), upstreams=())
    assert count == 1200 and len(out) == 1200  # written record by record
