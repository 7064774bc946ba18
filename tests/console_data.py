"""A small record for the console tests: models, users, keys, tags, outcomes, a stream with
pacing, logprobs, a replay and its original, an unpriced model and hostile content."""

from __future__ import annotations

import gzip
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import orjson
from aiohttp.test_utils import TestClient
from aiohttp.web import Application

from proxy.config import Config
from proxy.console import build_console
from proxy.exchange import Exchange
from proxy.store import upgrade
from tests.dbs import chat_exchange
from tests.dbs import recorded as record

HOSTILE = (
    "<script>window.pwned = 1; document.title = 'pwned'</script>"
    '<img src=x onerror="window.pwned = 2; alert(1)">'
    '<a href="javascript:window.pwned = 3">click me</a>'
    '</pre></details><svg onload="window.pwned = 4"></svg>{{ 7*7 }}'
)
BIG = "x" * (1 << 20)


@dataclass
class Seeded:
    old: Exchange
    tagged: Exchange
    stream: Exchange
    original: Exchange
    replay: Exchange
    hostile: Exchange
    big: Exchange
    unpriced: Exchange
    failed: Exchange

    def all(self) -> list[Exchange]:
        return list(vars(self).values())


def _answer(ex: Exchange, text: str, **choice: Any) -> None:
    """Give a chat exchange another answer text (its JSON and stored body agree)."""
    response = ex.response_json
    response["choices"][0]["message"]["content"] = text
    response["choices"][0].update(choice)
    ex.response_body = orjson.dumps(response)
    ex.response_bytes = len(ex.response_body)


def _ask(ex: Exchange, text: str) -> None:
    ex.request_json = {"model": ex.model, "messages": [{"role": "user", "content": text}]}
    ex.request_body = orjson.dumps(ex.request_json)


def build() -> Seeded:
    now = time.time()
    old = chat_exchange(
        started_at=now - 3 * 86400,
        model="gpt-4o",
        user="ann",
        key_hint="sk-...aaaa",
        key_hash="a" * 64,
    )
    # A snapshot of gpt-4o that exists (genai-prices prices the snapshots OpenAI published).
    old.response_model = old.response_json["model"] = "gpt-4o-2024-08-06"
    old.response_body = orjson.dumps(old.response_json)
    tagged = chat_exchange(
        started_at=now - 7200,
        tags={"team": "red", "env": "prod"},
        user="bob",
        key_hint="sk-...bbbb",
        key_hash="b" * 64,
        fingerprint="fp_two",
    )
    tagged.system_fingerprint = "fp_two"
    stream = chat_exchange(
        started_at=now - 3600, logprobs=["The", " sky", " is", " blue"], stream=True, ttft_ms=40.0
    )
    sse = b"data: {}\n\n" * 4
    stream.raw_stream_gz = gzip.compress(sse)
    stream.raw_pacing = [(10, 40.0), (20, 45.0), (30, 300.0), (40, 310.0)]
    original = chat_exchange(started_at=now - 600, user="cat", tags={"team": "blue"})
    _ask(original, "Name three colours of the sky")
    _answer(original, "Blue, grey and orange at dusk.")
    replay = chat_exchange(
        started_at=now - 300,
        user="cat",
        tags={"team": "blue"},
        replay_of=original.id,
        fingerprint="fp_new",
    )
    replay.system_fingerprint = "fp_new"
    _ask(replay, "Name three colours of the sky")
    _answer(replay, "Blue, white and red at dusk.", finish_reason="length")
    hostile = chat_exchange(started_at=now - 120, user=HOSTILE, tags={"x": HOSTILE})
    _ask(hostile, HOSTILE)
    _answer(hostile, HOSTILE)
    big = chat_exchange(started_at=now - 60)
    _ask(big, BIG)
    unpriced = chat_exchange(started_at=now - 30, model="house-model-9")
    failed = chat_exchange(
        started_at=now - 10, outcome="upstream_error", status=429, error="slow down"
    )
    return Seeded(old, tagged, stream, original, replay, hostile, big, unpriced, failed)


async def write(db_url: str, exchanges: list[Exchange]) -> None:
    await upgrade(db_url)
    await record(db_url, exchanges)


def console_app(db_url: str, **config: Any) -> Application:
    return build_console(replace(Config(), db_url=db_url, **config))


async def seeded_client(
    aiohttp_client: Any, db_url: str, **config: Any
) -> AsyncIterator[tuple[TestClient[Any, Any], Seeded]]:
    seeded = build()
    await write(db_url, seeded.all())
    yield await aiohttp_client(console_app(db_url, **config)), seeded
