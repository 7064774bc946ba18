"""The whole path on both engines: the real openai SDK -> the proxy -> the fake upstream, and
the record in the database read back as `show --json` gives it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from aiohttp import web
from openai.types.chat import ChatCompletionMessageParam

from proxy.config import Config, Upstream
from proxy.relay.app import build_app, make_runner
from proxy.store import create_engine, upgrade
from proxy.store.browse import list_exchanges
from proxy.store.read import get_exchange, reading
from proxy.store.recorder import DatabaseRecorder
from tests import dbs
from tests.conftest import FakeUpstream, Sdk, completion, start_site

db_url = dbs.db_url  # fixture

KEY = "sk-proj-e2eSECRET0123456789abcdefWXYZ"
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Say hello in two languages"}
]
TOKENS = ["Hello", " /", " Bon", "jour", " 世界"]
USAGE = {
    "prompt_tokens": 19,
    "completion_tokens": 5,
    "total_tokens": 24,
    "prompt_tokens_details": {"cached_tokens": 8, "audio_tokens": 0},
    "completion_tokens_details": {
        "reasoning_tokens": 2,
        "audio_tokens": 0,
        "accepted_prediction_tokens": 1,
        "rejected_prediction_tokens": 0,
    },
}
ANSWER = completion(
    choices=[
        {
            "index": 0,
            "message": {"role": "assistant", "content": "".join(TOKENS), "refusal": None},
            "logprobs": {
                "content": [
                    {
                        "token": token,
                        "logprob": -0.125 * i,
                        "bytes": list(token.encode()),
                        "top_logprobs": [
                            {"token": token, "logprob": -0.125 * i, "bytes": list(token.encode())},
                            {"token": "x", "logprob": -9.5, "bytes": [120]},
                        ],
                    }
                    for i, token in enumerate(TOKENS)
                ],
                "refusal": None,
            },
            "finish_reason": "stop",
        }
    ],
    usage=USAGE,
)


@dataclass
class Recording:
    base_url: str
    db_url: str
    runner: web.AppRunner

    async def stop(self) -> None:
        """Shut the proxy down as SIGTERM does: the recorder flushes everything it holds."""
        await self.runner.cleanup()


@pytest.fixture
async def recording(
    upstream: FakeUpstream, db_url: str, tmp_path: Path
) -> AsyncIterator[Recording]:
    await upgrade(db_url)
    config = replace(
        Config(),
        upstreams=(Upstream("openai", upstream.url, "/v1"),),
        db_url=db_url,
        spool_path=str(tmp_path / "e2e.spool"),
        batch_interval=0.01,
    )
    app = build_app(config, DatabaseRecorder(config))
    runner = make_runner(app, config)
    await runner.setup()
    yield Recording(await start_site(runner) + "/v1", db_url, runner)
    await runner.cleanup()


async def query(url: str, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return [tuple(row) for row in await conn.execute(sa.text(sql), params)]
    finally:
        await engine.dispose()


def as_json(value: Any) -> Any:
    import orjson

    return orjson.loads(value) if isinstance(value, str) else value


async def test_chat_completions_are_recorded_whole(
    upstream: FakeUpstream, recording: Recording, sdk: Sdk
) -> None:
    upstream.completion = ANSWER
    client = sdk(recording.base_url, KEY, max_retries=0)
    base = {"model": "gpt-4o-mini", "messages": MESSAGES, "logprobs": True, "top_logprobs": 2}
    requests: list[dict[str, Any]] = [
        base,
        {**base, "stream": True},
        {**base, "stream": True, "stream_options": {"include_usage": True}},
    ]
    headers = {"X-Flightrec-Tag-Team": "search", "X-Flightrec-User": "u-7"}
    for body in requests:
        result = await client.chat.completions.create(**body, extra_headers=headers)
        if body.get("stream"):
            [chunk async for chunk in result]
    await recording.stop()

    url = recording.db_url
    async with reading(url) as engine:
        summaries = list(reversed(await list_exchanges(engine)))
        shown_all = [await get_exchange(engine, s["id"]) for s in summaries]
    sources = []
    for shown, sent in zip(shown_all, requests, strict=True):
        # What the client sent, and the non-streaming answer however it travelled.
        assert shown["request"] == sent
        assert shown["response"] == ANSWER
        assert shown["usage"] == USAGE
        assert (shown["status"], shown["outcome"], shown["stream"]) == (200, "ok", "stream" in sent)
        assert shown["tags"] == {"team": "search"} and shown["user"] == "u-7"
        assert shown["key_hint"] == f"{KEY[:3]}...{KEY[-4:]}"
        assert shown["system_fingerprint"] == "fp_test"
        assert shown["duration_ms"] is not None and shown["ttfb_ms"] is not None
        sources.append(shown["usage_source"])

        found = await query(
            url,
            "SELECT token, logprob, bytes, top_logprobs FROM logprobs WHERE exchange_id = :id "
            "AND kind = 'content' ORDER BY choice_index, position",
            id=shown["id"],
        )
        expected = ANSWER["choices"][0]["logprobs"]["content"]
        assert [(t, lp, as_json(b), as_json(top)) for t, lp, b, top in found] == [
            (e["token"], e["logprob"], e["bytes"], e["top_logprobs"]) for e in expected
        ]
        usage_columns = await query(
            url,
            "SELECT prompt_tokens, completion_tokens, total_tokens, cached_tokens, "
            "reasoning_tokens, accepted_prediction_tokens, rejected_prediction_tokens "
            "FROM usage WHERE exchange_id = :id",
            id=shown["id"],
        )
        assert usage_columns == [(19, 5, 24, 8, 2, 1, 0)]
    assert sources == ["reported", "injected", "reported"]

    assert await query(
        url, "SELECT upstream, model, system_fingerprint, count FROM fingerprints"
    ) == [("openai", "gpt-4o-mini-2024-07-18", "fp_test", 3)]
    # The key went upstream (the fake saw it) but nowhere into the record.
    assert all(seen.headers.get("Authorization") == f"Bearer {KEY}" for seen in upstream.seen)
    tables = ("exchanges", "tags", "completions", "choices", "usage", "logprobs", "raw_streams")
    for table in tables:
        rows = await query(url, f"SELECT * FROM {table}")
        assert rows and KEY not in repr(rows) and KEY[-12:] not in repr(rows), table


async def test_omit_header_keeps_bodies_out_but_usage_in(
    upstream: FakeUpstream, recording: Recording, sdk: Sdk
) -> None:
    upstream.completion = ANSWER
    client = sdk(recording.base_url, KEY, max_retries=0)
    stream = await client.chat.completions.create(
        model="gpt-4o-mini",
        messages=MESSAGES,
        stream=True,
        extra_headers={"X-Flightrec-Omit": "all"},
    )
    [chunk async for chunk in stream]
    await recording.stop()
    async with reading(recording.db_url) as engine:
        [summary] = await list_exchanges(engine)
        shown = await get_exchange(engine, summary["id"])
    assert shown["request"] is None and shown["response"] is None
    assert shown["usage"] == USAGE and shown["usage_source"] == "injected"
    for table in ("choices", "logprobs", "raw_streams"):
        assert await query(recording.db_url, f"SELECT count(*) FROM {table}") == [(0,)]
