"""Recorded exchanges for the replay, playback and export tests, made the way users make them:
the real `openai` SDK through the real proxy (`build_app` + the database recorder) to a fake
upstream that answers each model with its own deterministic completion."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import openai
import orjson
from aiohttp import web
from openai.types.chat import ChatCompletionMessageParam

from proxy.config import Config, Upstream
from proxy.relay.app import build_app, make_runner
from proxy.store import upgrade
from proxy.store.recorder import DatabaseRecorder
from tests.conftest import FakeUpstream, completion, start_site
from tests.streamgen import chunks_to_sse, completion_to_chunks

KEY = "sk-proj-replaySECRET0123456789abcdWXYZ"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name a colour"}]
ANSWERS = {
    "gpt-4o-mini": completion(
        model="gpt-4o-mini-2024-07-18",
        choices=[
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Blue.\nLike the sky — 空.",
                    "refusal": None,
                },
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
    ),
    "gpt-4o": completion(
        model="gpt-4o-2024-08-06",
        system_fingerprint="fp_other",
        choices=[
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Green.\nLike the sky — 空.",
                    "refusal": None,
                },
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        usage={"prompt_tokens": 9, "completion_tokens": 14, "total_tokens": 23},
    ),
}


def answer_by_model(fake: FakeUpstream) -> None:
    """Make `fake` answer chat completions with `ANSWERS[model]`, streamed when asked (in
    10-byte pieces, so a stream reaches the proxy in many writes)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        payload = orjson.loads(await request.read())
        answer = ANSWERS[payload["model"]]
        if not payload.get("stream"):
            return web.Response(body=orjson.dumps(answer), content_type="application/json")
        include = bool((payload.get("stream_options") or {}).get("include_usage"))
        chunks = completion_to_chunks(answer, include_usage=include, rng=random.Random(7))
        data = chunks_to_sse(chunks)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for start in range(0, len(data), 10):
            await response.write(data[start : start + 10])
            await asyncio.sleep(0)
        await response.write_eof()
        return response

    fake.override = handle


@contextlib.asynccontextmanager
async def fake_upstream(**fields: Any) -> AsyncIterator[FakeUpstream]:
    """A `FakeUpstream` of our own, serving until the block ends (so a test can stop it)."""
    fake = FakeUpstream(**fields)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    fake.url = await start_site(runner) + "/v1"
    try:
        yield fake
    finally:
        await runner.cleanup()


def config_for(db_url: str, upstream_url: str, tmp_path: Path, **overrides: Any) -> Config:
    return replace(
        Config(),
        upstreams=(Upstream("openai", upstream_url, "/v1"),),
        db_url=db_url,
        spool_path=str(tmp_path / "test.spool"),
        batch_interval=0.01,
        **overrides,
    )


@dataclass
class Recorded:
    stream_id: str
    plain_id: str
    stream_bytes: bytes
    """What the streaming client received, byte for byte."""


async def record_two(config: Config, headers: dict[str, str] | None = None) -> Recorded:
    """One streamed and one plain chat completion of gpt-4o-mini, through a real proxy;
    `headers` go with both (e.g. control headers)."""
    await upgrade(config.db_url)
    app = build_app(config, DatabaseRecorder(config))
    runner = make_runner(app, config)
    await runner.setup()
    url = await start_site(runner)
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini",
            messages=MESSAGES,
            stream=True,
            extra_headers=headers,
        )
        stream_bytes = b"".join([part async for part in raw.http_response.aiter_bytes()])
        stream_id = raw.headers["X-Flightrec-Id"]
        plain = await client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini",
            messages=MESSAGES,
            extra_headers=headers,
        )
        plain_id = plain.headers["X-Flightrec-Id"]
    finally:
        await client.close()
        await runner.cleanup()  # as on SIGTERM: the recorder writes everything out
    return Recorded(stream_id, plain_id, stream_bytes)


@dataclass
class Run:
    code: int
    out: str
    err: str


async def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> Run:
    """`python -m proxy ARGS` in a subprocess, with no FLIGHTREC_* from the test's environment."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FLIGHTREC_", "OPENAI_"))}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", *args,
        env={**base, **(env or {})}, cwd=cwd,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return Run(process.returncode, out.decode(), err.decode())
