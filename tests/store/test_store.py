"""Exchanges to rows and back, on a real SQLite file and a real PostgreSQL database."""

from __future__ import annotations

import gzip
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.exchange import Exchange
from proxy.sinks.settle import settle
from proxy.store import StoreError, create_engine, pg_writer, sqlite_writer, upgrade
from proxy.store import tables as t
from proxy.store.browse import list_exchanges
from proxy.store.read import (
    get_exchange,
    get_raw_stream,
    parse_since,
    parse_tag,
)
from proxy.store.records import columns, table_records
from proxy.store.rows import exchange_fields, rows_for
from proxy.store.writer import writer_for
from tests import dbs
from tests.dbs import chat_exchange

db_url = dbs.db_url  # fixture
pg_url = dbs.pg_url  # fixture


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    await upgrade(db_url)
    engine = create_engine(db_url)
    yield engine
    await engine.dispose()


async def write(engine: AsyncEngine, exchanges: list[Exchange]) -> int:
    writer = writer_for(engine)
    try:
        for ex in exchanges:  # settled as `Sinks.accept` settles every exchange
            settle(ex, dbs.PRICES)
        return await writer.write([rows_for(ex) for ex in exchanges])
    finally:
        await writer.close()


async def rows(engine: AsyncEngine, sql: str, **params: Any) -> list[Any]:
    async with engine.connect() as conn:
        return list((await conn.execute(sa.text(sql), params)).all())


async def counts(engine: AsyncEngine) -> dict[str, int]:
    tables = ("exchanges", "tags", "completions", "choices", "usage", "logprobs")
    return {t: (await rows(engine, f"SELECT count(*) FROM {t}"))[0][0] for t in tables}


async def test_show_gives_back_what_was_recorded(engine: AsyncEngine) -> None:
    ex = chat_exchange(tags={"team": "search", "env": "prod"}, user="u-42", key_hint="sk-...a1b2")
    assert await write(engine, [ex]) == 1

    shown = await get_exchange(engine, ex.id)
    assert shown["request"] == ex.request_json
    assert shown["response"] == ex.response_json
    assert list(shown["response"]) == list(ex.response_json)  # key order kept
    assert shown["usage"] == ex.usage
    assert shown["tags"] == {"team": "search", "env": "prod"}
    assert (shown["user"], shown["key_hint"], shown["status"]) == ("u-42", "sk-...a1b2", 200)
    assert (shown["outcome"], shown["stream"], shown["usage_source"]) == ("ok", False, "reported")
    assert (shown["model"], shown["response_model"]) == ("gpt-4o-mini", "gpt-4o-mini-2024-07-18")
    assert (shown["ttfb_ms"], shown["duration_ms"], shown["ttft_ms"]) == (120.5, 130.25, None)
    # gpt-4o-mini by prefix: 5 x 0.15 + 4 cached x 0.075 + 12 x 0.60 per 1M tokens
    assert (shown["cost_usd"], shown["replay_of"]) == (8.25e-06, None)
    assert shown["price_entry"] == "genai-prices 0.2.3 openai/gpt-4o-mini standard"
    assert shown["system_fingerprint"] == "fp_test"
    assert shown["upstream_request_id"] == "req_123"
    started = datetime.fromisoformat(shown["started_at"])
    assert started.tzinfo is not None
    assert abs(started.timestamp() - ex.started_at) < 1e-3


async def test_every_column_holds_the_field_it_is_named_for(engine: AsyncEngine) -> None:
    # Rows are built by column name: a value under the wrong name must show here.
    ex = chat_exchange(
        query="a=1", user="u-7", key_hash="ab" * 8, key_hint="sk-...a1b2", replay_of="r" * 36
    )
    ex.stream, ex.ttft_ms, ex.chunks, ex.error = True, 99.5, 7, "boom"
    ex.outcome, ex.parse_errors = "stream_error", ["bad line"]
    ex.redacted = {"rules": ["email"], "dropped": ["logprobs"]}
    ex.response_bytes, ex.content_type = 4_000_000_000, "text/event-stream"
    ex.session = "sess-42"
    await write(engine, [ex])
    async with engine.connect() as conn:
        stored = (await conn.execute(sa.select(t.exchanges))).one()._asdict()
        completion = (await conn.execute(sa.select(t.completions))).one()._asdict()
    started = stored.pop("started_at")  # SQLite gives the UTC wall clock without a zone
    assert started.replace(tzinfo=started.tzinfo or UTC) == datetime.fromtimestamp(
        ex.started_at, UTC
    )
    cost = stored.pop("cost_usd")
    assert cost is not None and cost > 0
    assert stored == {
        "id": ex.id,
        "method": "POST",
        "path": "/v1/chat/completions",
        "query": "a=1",
        "upstream": "openai",
        "upstream_url": "https://api.openai.com/v1/chat/completions",
        "status": 200,
        "stream": True,
        "model": "gpt-4o-mini",
        "response_model": "gpt-4o-mini-2024-07-18",
        "outcome": "stream_error",
        "error": "boom",
        "request": ex.request_json,
        "request_body": None,
        "request_omitted": False,
        "response": ex.response_json,
        "response_body": None,
        "response_omitted": False,
        "response_bytes": 4_000_000_000,
        "content_type": "text/event-stream",
        "ttfb_ms": 120.5,
        "ttft_ms": 99.5,
        "duration_ms": 130.25,
        "chunks": 7,
        "upstream_request_id": "req_123",
        "key_hash": "ab" * 8,
        "key_hint": "sk-...a1b2",
        "end_user": "u-7",
        "replay_of": "r" * 36,
        "usage_source": "reported",
        "system_fingerprint": "fp_test",
        "parse_errors": ["bad line"],
        "price_entry": stored["price_entry"],
        "redacted": {"rules": ["email"], "dropped": ["logprobs"]},
        "session": "sess-42",
        "turn_key": stored["turn_key"],
        "parent_key": None,  # a first turn: no assistant message in the request
        "service_tier": None,
    }
    assert stored["turn_key"].startswith("chat:")
    assert stored["price_entry"] == "genai-prices 0.2.3 openai/gpt-4o-mini standard"
    assert completion == {
        "exchange_id": ex.id,
        "completion_id": ex.response_json["id"],
        "object": "chat.completion",
        "created": 1_723_024_748,
        "model": "gpt-4o-mini-2024-07-18",
        "system_fingerprint": "fp_test",
        "service_tier": None,
    }


async def test_every_usage_detail_is_a_column(engine: AsyncEngine) -> None:
    chat = chat_exchange()
    responses = chat_exchange(path="/v1/responses", response_json={"object": "response"})
    responses.usage = {
        "input_tokens": 30,
        "output_tokens": 7,
        "total_tokens": 37,
        "input_tokens_details": {"cached_tokens": 10},
        "output_tokens_details": {"reasoning_tokens": 2},
    }
    await write(engine, [chat, responses])
    columns = (
        "prompt_tokens, completion_tokens, total_tokens, cached_tokens, prompt_audio_tokens, "
        "reasoning_tokens, completion_audio_tokens, accepted_prediction_tokens, "
        "rejected_prediction_tokens"
    )
    found = await rows(engine, f"SELECT {columns} FROM usage WHERE exchange_id = :id", id=chat.id)
    assert tuple(found[0]) == (9, 12, 21, 4, 1, 5, 2, 3, 6)
    found = await rows(
        engine, f"SELECT {columns} FROM usage WHERE exchange_id = :i", i=responses.id
    )
    # Decoded: a class the usage does not report counts 0; predictions are as reported.
    assert tuple(found[0]) == (30, 7, 37, 10, 0, 2, 0, None, None)
    assert await rows(
        engine, "SELECT count(*) FROM completions WHERE exchange_id = :i", i=responses.id
    ) == [(0,)]


async def test_one_logprob_row_per_token_and_kind(engine: AsyncEngine) -> None:
    ex = chat_exchange(logprobs=["Hé", "llo", "\x00", " 世界"])
    ex.response_json["choices"].append(
        {
            "index": 1,
            "message": {"role": "assistant", "content": None, "refusal": "No."},
            "logprobs": {"content": None, "refusal": [{"token": "No", "logprob": -1.0}]},
            "finish_reason": "stop",
        }
    )
    await write(engine, [ex])
    found = await rows(
        engine,
        "SELECT choice_index, kind, position, token, logprob, bytes, top_logprobs FROM logprobs "
        "ORDER BY choice_index, kind, position",
    )
    assert [(r[0], r[1], r[2], r[3], r[4]) for r in found] == [
        (0, "content", 0, "Hé", -0.0),
        (0, "content", 1, "llo", -0.25),
        (0, "content", 2, "\ufffd", -0.5),  # NUL cannot live in PostgreSQL text...
        (0, "content", 3, " 世界", -0.75),
        (1, "refusal", 0, "No", -1.0),
    ]
    # ...but the bytes column and the stored response keep the real token.
    assert _json(found[2][5]) == [0]
    assert _json(found[3][6]) == [
        {"token": " 世界", "logprob": -0.75, "bytes": list(" 世界".encode())}
    ]
    shown = await get_exchange(engine, ex.id)
    assert shown["response"]["choices"][0]["logprobs"]["content"][2]["token"] == "\x00"
    choices = await rows(
        engine,
        "SELECT choice_index, content, refusal, finish_reason FROM choices ORDER BY choice_index",
    )
    assert [tuple(c) for c in choices] == [
        (0, "Héllo wörld — 世界 🚀!", None, "stop"),
        (1, None, "No.", "stop"),
    ]


def _json(value: Any) -> Any:
    import orjson

    return orjson.loads(value) if isinstance(value, str) else value


async def test_fingerprints_count_first_and_last_seen(engine: AsyncEngine) -> None:
    t0 = time.time() - 3600
    first = [chat_exchange(started_at=t0 + i) for i in range(3)]
    changed = chat_exchange(started_at=t0 + 10, fingerprint="fp_new")
    await write(engine, [*first[1:], changed])
    await write(engine, [first[0]])  # an older record arriving late (from a spool)
    found = await rows(
        engine,
        "SELECT upstream, model, system_fingerprint, count FROM fingerprints "
        "ORDER BY system_fingerprint",
    )
    model = "gpt-4o-mini-2024-07-18"
    assert [tuple(r) for r in found] == [
        ("openai", model, "fp_new", 1),
        ("openai", model, "fp_test", 3),
    ]
    seen = await rows(
        engine,
        "SELECT first_seen, last_seen FROM fingerprints WHERE system_fingerprint = 'fp_test'",
    )
    first_seen, last_seen = (_utc(v) for v in seen[0])
    assert abs(first_seen.timestamp() - t0) < 1e-3
    assert abs(last_seen.timestamp() - (t0 + 2)) < 1e-3


def _utc(value: str | datetime) -> datetime:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def test_every_record_holds_exactly_its_tables_columns() -> None:
    ex = chat_exchange(tags={"team": "a"}, logprobs=["x", "\x00y"])
    ex.raw_stream_gz, ex.raw_pacing = gzip.compress(b"data: [DONE]\n\n"), [(0, 1.0)]
    rows = rows_for(ex)
    assert list(exchange_fields(rows.exchange)) == columns(t.exchanges)
    built = dict(table_records([rows]))
    assert len(built) == 7  # the exchange and every child table
    for table, records in built.items():
        assert [len(record) for record in records] == [len(table.columns)] * len(records)
    # Logprob rows are built as tuples straight away: their order is the table's.
    named = [dict(zip(columns(t.logprobs), record, strict=True)) for record in built[t.logprobs]]
    assert named == [
        {
            "exchange_id": ex.id,
            "choice_index": 0,
            "kind": "content",
            "position": 0,
            "token": "x",
            "logprob": -0.0,
            "bytes": "[120]",
            "top_logprobs": '[{"token":"x","logprob":-0.0,"bytes":[120]}]',
        },
        {
            "exchange_id": ex.id,
            "choice_index": 0,
            "kind": "content",
            "position": 1,
            "token": "\ufffdy",  # PostgreSQL text holds no NUL; the response's JSON keeps it
            "logprob": -0.25,
            "bytes": "[0,121]",
            "top_logprobs": '[{"token":"\\u0000y","logprob":-0.25,"bytes":[0,121]}]',
        },
    ]
    fingerprint = rows.fingerprint
    assert fingerprint is not None and list(fingerprint) == columns(t.fingerprints)


async def test_a_batch_that_fails_at_its_end_leaves_nothing(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fingerprint upsert runs last, after every insert of the batch: broken, it fails the
    # one transaction, and none of the batch's rows stay.
    before = await counts(engine)
    for module in (pg_writer, sqlite_writer):
        monkeypatch.setattr(module, "COUNT_FINGERPRINTS", "INSERT INTO no_such_table VALUES (1)")
    with pytest.raises(Exception, match="no_such_table"):
        await write(engine, [chat_exchange(logprobs=["a"]) for _ in range(3)])
    assert await counts(engine) == before
    assert await rows(engine, "SELECT count(*) FROM fingerprints") == [(0,)]


async def test_writing_the_same_exchanges_again_writes_nothing(engine: AsyncEngine) -> None:
    batch = [chat_exchange(logprobs=["a", "b"], tags={"k": "v"}) for _ in range(5)]
    assert await write(engine, batch + batch[:2]) == 5  # duplicates inside one batch too
    before = await counts(engine)
    assert await write(engine, batch) == 0
    assert await write(engine, [*batch[3:], chat_exchange()]) == 1
    after = await counts(engine)
    assert after == {**before, "exchanges": 6, "completions": 6, "choices": 6, "usage": 6}
    assert await rows(engine, "SELECT sum(count) FROM fingerprints") == [(6,)]


async def test_omitted_bodies_are_not_stored_but_usage_is(engine: AsyncEngine) -> None:
    secret = "my secret prompt"
    ex = chat_exchange(content=secret, omit_request=True, omit_response=True)
    ex.request_json["messages"][0]["content"] = secret
    await write(engine, [ex])
    shown = await get_exchange(engine, ex.id)
    assert shown["request"] is None and shown["response"] is None
    assert shown["request_omitted"] and shown["response_omitted"]
    assert shown["usage"]["prompt_tokens"] == 9
    assert await rows(engine, "SELECT count(*) FROM choices") == [(0,)]
    body_columns = "request, request_body, response, response_body"
    assert await rows(engine, f"SELECT {body_columns} FROM exchanges") == [(None,) * 4]


async def test_bodies_that_are_not_json_are_kept_as_bytes(engine: AsyncEngine) -> None:
    ex = Exchange.start("POST", "/v1/audio/speech", "", "openai")
    ex.request_body = b"plain text, not json"
    ex.response_body = b"\xff\xfb\x90audio"
    ex.content_type = "audio/mpeg"
    await write(engine, [ex])
    shown = await get_exchange(engine, ex.id)
    assert shown["request"] == "plain text, not json"
    assert shown["response"] == {"base64": "//uQYXVkaW8="}
    assert shown["usage"] is None and shown["tags"] == {}


async def test_odd_shapes_lose_projections_never_the_record(engine: AsyncEngine) -> None:
    odd = chat_exchange(response_body=None)  # given as JSON only: no body text to keep
    odd.response_json = {
        "object": "chat.completion",
        "choices": [None, {"index": "x", "message": {"content": ["parts"]}, "logprobs": 5}],
        "created": 10**30,
    }
    odd.usage = {"prompt_tokens": "nine", "completion_tokens": 2**40, "total_tokens": True}
    odd.status = 10**12
    await write(engine, [odd])
    shown = await get_exchange(engine, odd.id)
    assert shown["response"]["choices"] == odd.response_json["choices"]
    assert shown["response"]["created"] == pytest.approx(1e30)  # beyond 64 bits: as a float
    assert shown["status"] is None
    found = await rows(engine, "SELECT prompt_tokens, completion_tokens, total_tokens FROM usage")
    assert found == [(None, None, None)]
    assert len(await rows(engine, "SELECT * FROM choices")) == 2


async def test_logs_filters_and_order(engine: AsyncEngine) -> None:
    now = time.time()
    old = chat_exchange(started_at=now - 7200, model="gpt-4o", tags={"team": "a"})
    mid = chat_exchange(started_at=now - 60, model="gpt-4o-mini", tags={"team": "b"})
    new = chat_exchange(started_at=now - 1, model="gpt-4o", tags={"team": "a", "env": "prod"})
    await write(engine, [old, mid, new])

    ids = [s["id"] for s in await list_exchanges(engine)]
    assert ids == [new.id, mid.id, old.id]
    assert [s["id"] for s in await list_exchanges(engine, limit=1)] == [new.id]
    assert [s["id"] for s in await list_exchanges(engine, model="gpt-4o")] == [new.id, old.id]
    recent = await list_exchanges(engine, since=parse_since("1h"))
    assert [s["id"] for s in recent] == [new.id, mid.id]
    tagged = await list_exchanges(engine, tags=[parse_tag("team=a"), parse_tag("ENV=prod")])
    assert [s["id"] for s in tagged] == [new.id]
    summary = (await list_exchanges(engine, limit=1))[0]
    assert summary["tags"] == {"team": "a", "env": "prod"}
    assert (summary["prompt_tokens"], summary["completion_tokens"]) == (9, 12)


async def test_show_by_unique_prefix_and_unknown_ids(engine: AsyncEngine) -> None:
    ex = chat_exchange()
    await write(engine, [ex])
    assert (await get_exchange(engine, ex.id[:13]))["id"] == ex.id
    with pytest.raises(StoreError, match="no exchange with id 'nope'"):
        await get_exchange(engine, "nope")
    with pytest.raises(StoreError, match="no exchange"):
        await get_exchange(engine, "%%%%%%%%")  # LIKE wildcards are escaped


def test_since_and_tag_parsing() -> None:
    now = datetime(2025, 1, 2, 12, 0, tzinfo=UTC)
    assert parse_since("90m", now) == now - timedelta(minutes=90)
    assert parse_since("2025-01-01T00:00:00Z") == datetime(2025, 1, 1, tzinfo=UTC)
    with pytest.raises(ValueError, match="expected a duration"):
        parse_since("yesterday")
    for beyond in ("99999999d", "999999999999999w", "0001-01-01T00:00+01:00"):
        with pytest.raises(ValueError, match="out of range"):
            parse_since(beyond)
    assert parse_tag("Team=a=b") == ("team", "a=b")
    with pytest.raises(ValueError, match="key=value"):
        parse_tag("team")


async def test_raw_stream_kept_exactly_for_playback(engine: AsyncEngine) -> None:
    raw = b'data: {"choices":[{"delta":{"content":"H\xc3\xa9"}}]}\r\n\r\ndata: [DONE]\n\n' * 50
    gz = gzip.compress(raw)
    pacing = [(10, 1.5), (len(raw), 9.25)]
    streamed = chat_exchange(stream=True, raw_stream_gz=gz, raw_pacing=pacing)
    omitted = chat_exchange(stream=True, raw_stream_gz=gz, omit_response=True)
    await write(engine, [streamed, omitted])
    assert await get_raw_stream(engine, streamed.id) == (raw, [(10, 1.5), (len(raw), 9.25)])
    assert await get_raw_stream(engine, omitted.id) is None
    [(size,)] = await rows(engine, "SELECT length(gz) FROM raw_streams")
    assert size == len(gz)  # stored as the record holds it, compressed once


async def test_a_json_body_is_stored_as_the_text_that_was_sent(engine: AsyncEngine) -> None:
    text = b'{ "model" : "gpt-4o-mini",\n  "messages": [], "z": 1, "a": 1.10 }\n'
    ex = chat_exchange()
    ex.request_body, ex.request_json = text, orjson.loads(text)
    await write(engine, [ex])
    async with engine.connect() as conn:
        as_text = sa.select(sa.cast(t.exchanges.c.request, sa.Text))
        stored = (await conn.execute(as_text)).scalar_one()
    # Spacing, key order and numbers as written (serialised again, 1.10 would be 1.1) are
    # kept; it reads back as what was parsed.
    assert stored == text.decode()
    shown = await get_exchange(engine, ex.id)
    assert list(shown["request"]) == ["model", "messages", "z", "a"]


@pytest.fixture
async def lz4_engine(pg_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on an empty PostgreSQL database whose server has lz4."""
    await upgrade(pg_url)
    engine = create_engine(pg_url)
    try:
        async with engine.connect() as conn:
            if not (await conn.exec_driver_sql(pg_writer.TAKES_LZ4)).scalar():
                pytest.skip("this PostgreSQL has no lz4 (before 14, or built without it)")
        yield engine
    finally:
        await engine.dispose()


def long_answer() -> Exchange:
    """An exchange whose response the server compresses as it stores it."""
    return chat_exchange(content="an answer long enough to be compressed " * 100)


async def compression(engine: AsyncEngine, exchange_id: str) -> str | None:
    sql = "SELECT pg_column_compression(response) FROM exchanges WHERE id = :id"
    [(method,)] = await rows(engine, sql, id=exchange_id)
    return None if method is None else str(method)


async def test_postgresql_compresses_long_bodies_with_lz4_where_it_has_it(
    lz4_engine: AsyncEngine, pg_url: str
) -> None:
    """The writer's transactions ask the server for lz4 (faster to store than its default,
    pglz); other sessions keep the server's default, and a value stored before stays pglz."""
    engine = lz4_engine
    before = long_answer()
    async with engine.begin() as conn:  # as a writer without the setting stored it
        await pg_writer.write_in(conn, [rows_for(before)])
    long, short = long_answer(), chat_exchange()
    assert await write(engine, [long, short]) == 2
    found = await rows(engine, "SELECT id, pg_column_compression(response) FROM exchanges")
    assert dict(found) == {before.id: "pglz", long.id: "lz4", short.id: None}
    assert await rows(engine, "SHOW default_toast_compression") == [("pglz",)]
    # An operator's own choice (here the database's) is kept.
    name = make_url(pg_url).database
    async with engine.connect() as conn:
        await conn.exec_driver_sql(f'ALTER DATABASE "{name}" SET default_toast_compression = pglz')
        await conn.commit()
    await engine.dispose()  # new sessions read the database's setting
    chosen = long_answer()
    assert await write(engine, [chosen]) == 1
    assert await compression(engine, chosen.id) == "pglz"


async def test_the_postgresql_writer_asks_about_lz4_again_after_a_failed_write(
    lz4_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What it learnt of the server is forgotten when a write fails: after a failover the
    server may be another one."""
    writer = pg_writer.PgWriter(lz4_engine)
    monkeypatch.setattr(pg_writer, "TAKES_LZ4", "SELECT false")  # the first server's answer
    await writer.write([rows_for(chat_exchange())])
    monkeypatch.setattr(pg_writer, "COUNT_FINGERPRINTS", "INSERT INTO no_such_table VALUES (1)")
    with pytest.raises(Exception, match="no_such_table"):
        await writer.write([rows_for(chat_exchange())])
    monkeypatch.undo()  # the server that answers now has lz4
    long = long_answer()
    assert await writer.write([rows_for(long)]) == 1
    assert await compression(lz4_engine, long.id) == "lz4"
