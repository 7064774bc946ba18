"""`flightrec replay` as an operator runs it (a real process against a real SQLite file and a
real upstream): each replay ends in its own result whatever happens to the others, the
comparison is of what a user means, and a redacted prompt is not sent without being asked."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import orjson
from aiohttp import web
from openai.types.chat import ChatCompletionMessageParam

from proxy.config import ConfigError
from proxy.privacy.redact import parse_rules
from proxy.relay.app import build_app, make_runner
from proxy.store import upgrade
from proxy.store.read import get_exchange, reading
from proxy.store.recorder import DatabaseRecorder
from tests import dbs
from tests.conftest import FakeUpstream, completion, start_site
from tests.recordings import KEY, answer_by_model, cli, config_for, record_two

ENV = {"OPENAI_API_KEY": KEY}


def _env(url: str, upstream: FakeUpstream) -> dict[str, str]:
    return {**ENV, "FLIGHTREC_DB_URL": url, "FLIGHTREC_UPSTREAM": upstream.url}


async def test_a_cut_replay_ends_in_its_own_line_and_the_others_go_on(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    """The streamed replay's body is cut by the upstream: its line says so, the plain one is
    compared as usual, no traceback, exit status 1; both replays are recorded."""
    answer_by_model(upstream)
    url = dbs.sqlite_url(tmp_path / "r.db")
    recorded = await record_two(config_for(url, upstream.url, tmp_path))
    answering = upstream.override
    assert answering is not None

    async def cut_streams(request: web.Request) -> web.StreamResponse:
        if not orjson.loads(await request.read()).get("stream"):
            return await answering(request)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"id":"c","object":"chat.completion.chunk","choices":[')
        assert request.transport is not None
        request.transport.close()
        return response

    upstream.override = cut_streams
    run = await cli(
        "replay", recorded.stream_id, recorded.plain_id, env=_env(url, upstream), cwd=tmp_path
    )
    assert run.code == 1
    assert "Traceback" not in run.err, run.err
    stream_block, plain_block = run.out.split("\n\n")
    assert stream_block.startswith(recorded.stream_id)
    assert "upstream_disconnected" in stream_block and "error:" in stream_block
    assert plain_block.startswith(recorded.plain_id) and "200 ok" in plain_block
    assert "content same, tool calls same, finish reason same" in plain_block
    run = await cli("logs", "--json", env={"FLIGHTREC_DB_URL": url})
    replays = [e for e in orjson.loads(run.out) if e["replay_of"]]
    assert sorted(e["status"] is not None for e in replays) == [True, True]


_TOOL = {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "c"}'}


def _tool_answers(upstream: FakeUpstream) -> None:
    """Answers as llama-server does: every call's id random, `timings` that differ each time;
    gpt-4o-mini says "Blue." and gpt-4o "Green.", neither with a newline at the end."""

    async def handle(request: web.Request) -> web.StreamResponse:
        payload = orjson.loads(await request.read())
        call = {"id": f"call_{random.getrandbits(64):x}", "type": "function", "function": _TOOL}
        message = {
            "role": "assistant",
            "content": "Blue." if "mini" in payload["model"] else "Green.",
        }
        choice = {
            "index": 0,
            "message": {**message, "tool_calls": [call]},
            "finish_reason": "tool_calls",
        }
        timings = {"prompt_n": 9, "predicted_ms": random.uniform(10, 90)}
        answer = completion(model=payload["model"], choices=[choice], timings=timings)
        return web.json_response(answer)

    upstream.override = handle


async def _record(config: Any, messages: list[ChatCompletionMessageParam]) -> str:
    """One plain chat completion through a real proxy; its id."""
    await upgrade(config.db_url)
    app = build_app(config, DatabaseRecorder(config))
    runner = make_runner(app, config)
    await runner.setup()
    client = openai.AsyncOpenAI(base_url=await start_site(runner) + "/v1", api_key=KEY)
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini", messages=messages
        )
        return raw.headers["X-Flightrec-Id"]
    finally:
        await client.close()
        await runner.cleanup()


async def test_replay_compares_what_a_user_means(upstream: FakeUpstream, tmp_path: Path) -> None:
    """Only the tool call's id and llama.cpp's `timings` differ: the same answer, no diff. On
    another model the text differs: a diff whose lines stay apart though neither answer ends
    in a newline."""
    _tool_answers(upstream)
    url = dbs.sqlite_url(tmp_path / "r.db")
    original = await _record(
        config_for(url, upstream.url, tmp_path), [{"role": "user", "content": "Weather?"}]
    )
    run = await cli("replay", original, env=_env(url, upstream), cwd=tmp_path)
    assert run.code == 0, run.err
    assert "content same, tool calls same, finish reason same" in run.out
    assert "---" not in run.out
    run = await cli("replay", original, "--model", "gpt-4o", env=_env(url, upstream), cwd=tmp_path)
    assert run.code == 0, run.err
    assert "content DIFFERS, tool calls same, finish reason same" in run.out
    assert "--- original\n+++ replay\n@@ -1,3 +1,3 @@\n-Blue.\n+Green.\n" in run.out
    assert ' [tool call 0] get_weather({"city":"Paris","unit":"c"})' in run.out


async def test_a_redacted_prompt_is_not_replayed_unless_allowed(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    answer_by_model(upstream)
    url = dbs.sqlite_url(tmp_path / "r.db")
    rules = parse_rules([{"preset": "email"}], ConfigError)
    config = replace(config_for(url, upstream.url, tmp_path), redact=rules)
    prompt = "Name a colour for ann@example.com"
    original = await _record(config, [{"role": "user", "content": prompt}])
    async with reading(url) as engine:
        stored = await get_exchange(engine, original)
    assert stored["request"]["messages"][0]["content"] == "Name a colour for [REDACTED:email]"
    upstream.seen.clear()

    run = await cli("replay", original, env=_env(url, upstream), cwd=tmp_path)
    assert run.code == 1 and "Traceback" not in run.err
    assert run.err.strip() == (
        f"Error: exchange {original}: redacted by email, so its request may hold the "
        "replacements instead of what was sent; --allow-redacted replays it as stored"
    )
    assert upstream.seen == []
    run = await cli("replay", original, "--allow-redacted", env=_env(url, upstream), cwd=tmp_path)
    assert run.code == 0, run.err
    sent = orjson.loads(upstream.seen[-1].body)
    assert sent["messages"][0]["content"] == "Name a colour for [REDACTED:email]"
