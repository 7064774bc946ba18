"""Batch API traffic through the proxy (SPEC 12): the input lines, the batch, and each result of
its output and error files booked once, at batch rates, with the real openai SDK as client and
a real database."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from openai.types import Batch

from proxy.config import Config, Upstream
from proxy.exchange import Exchange
from proxy.pricing import Prices
from proxy.relay.app import build_app, make_runner
from proxy.sinks.fanout import MemoryRecorder, Sinks
from proxy.store import upgrade
from proxy.store.batch_rows import batch_rows, file_part
from proxy.store.read import reading
from proxy.store.recorder import DatabaseRecorder
from proxy.store.reprice import reprice
from proxy.stream.batchfile import ResultLines, lines

from .. import dbs
from ..batchkit import (
    COST_1,
    COST_2,
    CREATED,
    ERRORS,
    INPUT,
    INPUT_LINES,
    OUTPUT,
    FakeBatches,
    fake_batches,
    output_lines,
)
from ..conftest import Sdk, start_site
from ..faultkit import Serve
from ..relay.test_record_e2e import query

db_url = dbs.db_url  # fixture
KEY = "sk-proj-batchSECRET0123456789abcd"


@pytest.fixture
async def batches_upstream() -> AsyncIterator[FakeBatches]:
    async with fake_batches() as fake:
        yield fake


async def submit(uploader: openai.AsyncOpenAI, batcher: openai.AsyncOpenAI) -> Batch:
    """Upload the input file with `uploader`, create the batch and retrieve it (done, as the
    fake does on retrieval) with `batcher`."""
    uploaded = await uploader.files.create(file=("in.jsonl", INPUT), purpose="batch")
    batch = await batcher.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = await batcher.batches.retrieve(batch.id)
    assert done.output_file_id is not None and done.error_file_id is not None
    return done


async def run_batch(client: openai.AsyncOpenAI, downloads: list[openai.AsyncOpenAI]) -> str:
    """Upload, create, retrieve, then download the output file with each of `downloads` and
    the error file once; returns the batch id."""
    done = await submit(client, client)
    assert done.status == "expired"
    output_file_id = str(done.output_file_id)
    contents = await asyncio.gather(*(d.files.content(output_file_id) for d in downloads))
    assert all(content.content == OUTPUT for content in contents)  # passed unchanged
    await client.files.content(str(done.error_file_id))
    return done.id


async def booked(url: str) -> list[tuple[Any, ...]]:
    return await query(
        url,
        "SELECT r.custom_id, r.batch_id, e.status, e.outcome, e.cost_usd, e.price_entry,"
        " e.model, e.path, e.request, e.upstream_request_id"
        " FROM batch_results r JOIN exchanges e ON e.id = r.exchange_id ORDER BY r.custom_id",
    )


def expected(batch_id: str) -> list[tuple[Any, ...]]:
    entry = True  # priced at batch rates, as `price_entry` says
    path = "/v1/chat/completions"
    return [
        ("r1", batch_id, 200, "ok", COST_1, entry, "gpt-5", path, INPUT_LINES[0]["body"], "req_b1"),
        ("r2", batch_id, 200, "ok", COST_2, entry, "gpt-5", path, INPUT_LINES[1]["body"], "req_b2"),
        ("r3", batch_id, 400, "upstream_error", None, False, "gpt-5", path, INPUT_LINES[2]["body"],
         "req_b3"),
        ("r4", batch_id, None, "upstream_error", None, False, "gpt-5", path, INPUT_LINES[3]["body"],
         None),
    ]  # fmt: skip


def as_json(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The request column as an object on both engines (SQLite gives its text); whether the
    price entry says batch."""
    return [
        (*row[:5], (row[5] or "").endswith(" batch"), *row[6:8], _loads(row[8]), row[9])
        for row in rows
    ]


def _loads(value: Any) -> Any:
    return orjson.loads(value) if isinstance(value, str) else value


@asynccontextmanager
async def recording_proxy(
    upstream: str, db_url: str, tmp_path: Path, **settings: Any
) -> AsyncIterator[str]:
    """The proxy as `serve` builds it, recording to `db_url`; its OpenAI base URL. Leaving the
    block shuts it down as SIGTERM does: everything it holds is written."""
    await upgrade(db_url)
    config = replace(
        Config(),
        upstreams=(Upstream("openai", upstream, "/v1"),),
        db_url=db_url,
        spool_path=str(tmp_path / "batches.spool"),
        batch_interval=0.01,
        **settings,
    )
    app = build_app(config, DatabaseRecorder(config))
    runner = make_runner(app, config)
    await runner.setup()
    try:
        yield await start_site(runner) + "/v1"
    finally:
        await runner.cleanup()


async def test_each_result_is_booked_once_at_batch_rates(
    batches_upstream: FakeBatches, db_url: str, tmp_path: Path, sdk: Sdk
) -> None:
    async with recording_proxy(batches_upstream.url, db_url, tmp_path) as base_url:
        client = sdk(base_url, KEY)
        batch_id = await run_batch(client, [client, client])
    rows = as_json(await booked(db_url))
    assert rows == expected(batch_id)
    async with reading(db_url) as engine:  # repricing keeps batch rates
        done = await reprice(engine, Prices())
        assert sum(change.changed for change in done.models.values()) == 0
    assert as_json(await booked(db_url)) == rows
    requests = await query(db_url, "SELECT custom_id, line, model FROM batch_requests ORDER BY 1")
    assert requests == [
        ("r1", 1, "gpt-5"),
        ("r2", 2, "gpt-5"),
        ("r3", 3, "gpt-5"),
        ("r4", 4, "gpt-5"),
    ]
    seen = await query(db_url, "SELECT id, status, output_file_id FROM batches")
    assert seen == [(batch_id, "expired", "file-out0001")]
    total = await query(db_url, "SELECT sum(cost_usd) FROM exchanges")
    assert total == [(COST_1 + COST_2,)]


def test_file_part_and_lines_read_what_the_sdk_sends() -> None:
    body = (
        b'--b1\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b'--b1\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n" + INPUT + b"\r\n--b1--\r\n"
    )
    part = file_part(body)
    assert part == INPUT
    assert [n for n, _ in lines(part + b"\n\nnot json\n[1]\n")] == [1, 2, 3, 4]


async def test_two_serve_processes_on_one_database_book_each_result_once(
    batches_upstream: FakeBatches, db_url: str, tmp_path: Path, sdk: Sdk
) -> None:
    """`flightrec serve` twice on one database, each downloading the output file at the same
    time: the database books each result once, whichever process writes it first."""
    settings = {"db_url": db_url, "batch_interval": 0.01, "log_level": "info"}
    serves = [Serve(tmp_path / name, batches_upstream.url, dict(settings)) for name in "ab"]
    try:
        for serve in serves:
            serve.workdir.mkdir()
            await serve.start()
        first, second = (sdk(serve.url + "/v1", KEY) for serve in serves)
        batch_id = await run_batch(first, [first, second, second])
    finally:
        for serve in serves:
            serve.release()  # SIGTERM: each writes out what it holds
    assert as_json(await booked(db_url)) == expected(batch_id)
    total = await query(db_url, "SELECT sum(cost_usd) FROM exchanges")
    assert total == [(COST_1 + COST_2,)]
    logs = "".join(serve.log_text() for serve in serves)
    assert KEY not in logs and "Traceback" not in logs


async def test_a_file_larger_than_the_record_keeps_is_booked_line_by_line(
    batches_upstream: FakeBatches, tmp_path: Path, sdk: Sdk
) -> None:
    """The output file is read as it passes: every result is booked although the file is far
    larger than `max_record_bytes`; a line longer than that is skipped and said."""
    usage = {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100}
    huge = {"status_code": 200, "request_id": "req_huge", "body": {"pad": "x" * 20_000}}
    long_line = orjson.dumps({"id": "batch_req_huge", "custom_id": "huge", "response": huge})
    batches_upstream.output = output_lines(400, usage) + long_line + b"\n"
    assert len(batches_upstream.output) > 10 * 16_384
    url = dbs.sqlite_url(tmp_path / "big.db")
    async with recording_proxy(
        batches_upstream.url, url, tmp_path, max_record_bytes=16_384
    ) as base:
        client = sdk(base, KEY)
        done = await submit(client, client)
        content = await client.files.content(str(done.output_file_id))
        assert content.content == batches_upstream.output
    # 1000 in at $0.625 and 100 out at $5 per 1M: $0.000625 + $0.0005 each.
    found = await query(
        url, "SELECT count(*), min(e.cost_usd), max(e.cost_usd), count(r.batch_id)"
        " FROM batch_results r JOIN exchanges e ON e.id = r.exchange_id",
    )  # fmt: skip
    assert found == [(400, 0.001125, 0.001125, 400)]
    errors = await query(url, "SELECT parse_errors FROM exchanges WHERE path LIKE '%/content'")
    assert orjson.loads(errors[0][0]) == [
        "response body larger than max_record_bytes: not recorded",
        "batch file line 401 longer than max_record_bytes",
    ]


async def test_an_output_file_seen_before_its_batch_is_booked_then_linked(
    batches_upstream: FakeBatches, db_url: str, tmp_path: Path, sdk: Sdk
) -> None:
    """The batch was created and retrieved around the proxy: its output file passing through
    is booked by its line ids with no batch; once `batches.retrieve` passes, it is linked."""
    direct = sdk(batches_upstream.url, KEY)
    async with recording_proxy(batches_upstream.url, db_url, tmp_path) as base_url:
        client = sdk(base_url, KEY)
        batch = await submit(client, direct)
        await client.files.content(str(batch.output_file_id))
        sql = "SELECT custom_id, batch_id FROM batch_results ORDER BY 1"
        for _ in range(500):
            if len(await query(db_url, sql)) == 2:
                break
            await asyncio.sleep(0.01)
        assert await query(db_url, sql) == [("r1", None), ("r2", None)]
        unlinked = await query(db_url, "SELECT count(*) FROM exchanges WHERE cost_usd IS NOT NULL")
        assert unlinked == [(2,)]  # booked and priced before the batch is known
        await client.batches.retrieve(batch.id)
    rows = as_json(await booked(db_url))
    assert rows == expected(batch.id)[:2]


class Spy:
    """A sink that keeps what it is given."""

    def __init__(self) -> None:
        self.seen: list[Exchange] = []

    async def start(self) -> None: ...

    def accept(self, exchange: Exchange) -> None:
        self.seen.append(exchange)

    async def stop(self) -> None: ...


def test_a_batch_result_goes_to_the_record_only() -> None:
    """Metrics and traces count requests through the proxy; a batch result is not one, and is
    seen again with every download of its file."""
    recorder, spy = MemoryRecorder(), Spy()
    sinks = Sinks([recorder, spy])
    plain = Exchange.start("GET", "/v1/models", "", "openai")
    result = Exchange.start("POST", "/v1/chat/completions", "", "openai")
    result.batch_line = {"line_id": "batch_req_1", "file_id": "file-1", "custom_id": "r1"}
    sinks.accept(plain)
    sinks.accept(result)
    assert recorder.exchanges == [plain, result]
    assert spy.seen == [plain]


def _seen(method: str, path: str, response: Any) -> Exchange:
    ex = Exchange.start(method, path, "", "openai", started_at=1_764_000_000.5)
    ex.status, ex.response_json = 200, response
    return ex


def test_every_answer_that_shows_a_batch_records_it() -> None:
    """A list (`batches.list`) and a cancel show batches as retrieve does; a failed answer or
    an omitted response shows none."""
    batch = {"id": "batch_1", "object": "batch", "status": "cancelling", "input_file_id": "f-in",
             "endpoint": "/v1/chat/completions", "created_at": 1_764_000_000}  # fmt: skip
    listed = {"object": "list", "data": [batch, {**batch, "id": "batch_2", "status": "cancelled",
              "output_file_id": "f-out"}], "has_more": False}  # fmt: skip
    found = batch_rows(_seen("GET", "/v1/batches", listed))
    assert found is not None
    assert [(b["id"], b["status"], b["output_file_id"]) for b in found.batches] == [
        ("batch_1", "cancelling", None),
        ("batch_2", "cancelled", "f-out"),
    ]
    assert found.files == ["f-in", "f-in", "f-out"]
    cancel = batch_rows(_seen("POST", "/v1/batches/batch_1/cancel", batch))
    assert cancel is not None and cancel.batches[0]["status"] == "cancelling"
    failed = _seen("GET", "/v1/batches/batch_1", batch)
    failed.status = 404
    omitted = _seen("GET", "/v1/batches/batch_1", batch)
    omitted.omit_response = True
    assert batch_rows(failed) is None and batch_rows(omitted) is None


def test_result_lines_read_in_any_pieces_keep_only_the_open_line() -> None:
    """Pieces cut anywhere, a last line without a newline, blank and broken lines: each result
    once, in order, and no more than one unfinished line held."""
    download = _seen("GET", "/v1/files/f-out/content", None)
    emitted: list[Exchange] = []
    reader = ResultLines(download, "/v1", "f-out", emitted.append, max_line_bytes=4096)
    data = OUTPUT + b"\nnot json\n" + ERRORS.rstrip(b"\n")
    for at in range(0, len(data), 7):
        reader.feed(data[at : at + 7])
        assert len(reader._tail) <= 4096
    reader.end()
    assert [(ex.batch_line or {}).get("custom_id") for ex in emitted] == ["r1", "r2", "r3", "r4"]
    assert [ex.outcome for ex in emitted] == ["ok", "ok", "upstream_error", "upstream_error"]
    assert emitted[3].error == (
        "This request could not be executed before the completion window expired."
    )
    assert emitted[0].started_at == CREATED + 1  # when the provider made it
    assert emitted[0].path == "/v1/chat/completions" and emitted[0].upstream_request_id == "req_b1"
