"""Databases for the store tests: a SQLite file in tmp_path, or a throwaway PostgreSQL database.

PostgreSQL tests read `FLIGHTREC_TEST_PG_URL` (a `postgresql+asyncpg://` URL whose server the
tests may create databases on) and skip, saying why, when it is unset or unreachable. Each test
gets its own database, dropped afterwards, so tests never see each other's rows.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import orjson
import pytest
from sqlalchemy.engine import make_url

from proxy.exchange import Exchange
from proxy.pricing import Prices
from proxy.sinks.settle import settle
from proxy.store import create_engine
from proxy.store.rows import rows_for
from proxy.store.writer import writer_for

PG_ENV = "FLIGHTREC_TEST_PG_URL"

PRICES = Prices()


async def store(url: str, exchanges: list[Exchange]) -> int:
    """Write `exchanges` as the recorder does (its writer, one batch); returns how many were new."""
    engine = create_engine(url)
    writer = writer_for(engine)
    try:
        for ex in exchanges:  # settled as `Sinks.accept` settles every exchange
            settle(ex, PRICES)
        return await writer.write([rows_for(ex) for ex in exchanges])
    finally:
        await writer.close()
        await engine.dispose()


def sqlite_url(path: Path) -> str:
    return f"sqlite+aiosqlite:///{path}"


async def _admin() -> tuple[asyncpg.Connection, str]:
    base = os.environ.get(PG_ENV)
    if not base:
        pytest.skip(f"{PG_ENV} is not set: PostgreSQL tests skipped")
    url = make_url(base)
    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    try:
        conn = await asyncpg.connect(dsn, timeout=5)
    except (OSError, asyncpg.PostgresError) as exc:
        pytest.skip(f"PostgreSQL at {url.render_as_string()} unreachable: {exc}")
    return conn, base


async def _fresh_pg() -> AsyncIterator[str]:
    admin, base = await _admin()
    name = f"flightrec_t_{uuid.uuid4().hex[:12]}"
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    async for url in _fresh_pg():
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """An empty database on each engine."""
    if request.param == "sqlite":
        yield sqlite_url(tmp_path / "flightrec.db")
        return
    async for url in _fresh_pg():
        yield url


def logprob_tokens(texts: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "token": text,
            "logprob": -0.25 * i,
            "bytes": list(text.encode()),
            "top_logprobs": [{"token": text, "logprob": -0.25 * i, "bytes": list(text.encode())}],
        }
        for i, text in enumerate(texts)
    ]


def chat_usage(prompt: int, completion: int, cached: int = 0, reasoning: int = 0) -> dict[str, Any]:
    """A Chat Completions usage object as OpenAI sends it."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": reasoning, "audio_tokens": 0},
    }


def chat_exchange(
    *,
    model: str = "gpt-4o-mini",
    content: str = "Héllo wörld — 世界 🚀!",
    fingerprint: str | None = "fp_test",
    logprobs: list[str] | None = None,
    started_at: float | None = None,
    **fields: Any,
) -> Exchange:
    """A finished, non-streamed chat completion exchange as the forwarder hands it over."""
    ex = Exchange.start("POST", "/v1/chat/completions", "", "openai")
    if started_at is not None:
        ex.started_at = started_at
    ex.upstream_url = "https://api.openai.com/v1/chat/completions"
    ex.model = model
    ex.request_json = {"model": model, "messages": [{"role": "user", "content": "Say hi"}]}
    ex.request_body = orjson.dumps(ex.request_json)
    usage = {
        "prompt_tokens": 9,
        "completion_tokens": 12,
        "total_tokens": 21,
        "prompt_tokens_details": {"cached_tokens": 4, "audio_tokens": 1},
        "completion_tokens_details": {
            "reasoning_tokens": 5,
            "audio_tokens": 2,
            "accepted_prediction_tokens": 3,
            "rejected_prediction_tokens": 6,
        },
    }
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": content, "refusal": None},
        "logprobs": None if logprobs is None else {"content": logprob_tokens(logprobs)},
        "finish_reason": "stop",
    }
    ex.response_json = {
        "id": "chatcmpl-" + ex.id[-8:],
        "object": "chat.completion",
        "created": 1_723_024_748,
        "model": model + "-2024-07-18",
        "system_fingerprint": fingerprint,
        "choices": [choice],
        "usage": usage,
    }
    ex.response_body = orjson.dumps(ex.response_json)
    ex.status = 200
    ex.content_type = "application/json"
    ex.response_bytes = len(ex.response_body)
    ex.usage = usage
    ex.usage_source = "reported"
    ex.response_model = ex.response_json["model"]
    ex.system_fingerprint = fingerprint
    ex.ttfb_ms, ex.duration_ms = 120.5, 130.25
    ex.upstream_request_id = "req_123"
    for name, value in fields.items():
        setattr(ex, name, value)
    # A body's JSON and its text must agree (the store keeps the text): a JSON given here has
    # no text of its own.
    for part in ("request", "response"):
        if f"{part}_json" in fields and f"{part}_body" not in fields:
            setattr(ex, f"{part}_body", None)
    return ex


async def recorded(url: str, exchanges: list[Exchange]) -> None:
    """A database at the newest schema holding `exchanges`, as the recorder writes them."""
    from proxy.store.migrate import upgrade

    await upgrade(url)
    await store(url, exchanges)
