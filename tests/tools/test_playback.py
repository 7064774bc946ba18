"""`playback`: recorded answers served as a mock upstream, with no upstream running. The real
`openai` SDK and a raw HTTP client are the clients; the record is made through the real proxy."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web

from proxy.relay.app import build_app, make_runner
from proxy.store import upgrade
from proxy.store.browse import list_exchanges
from proxy.store.read import get_exchange, get_raw_stream, reading
from proxy.store.recorder import DatabaseRecorder
from proxy.tools.playback import PlaybackOptions, canonical, playing
from tests import dbs
from tests.conftest import reserved_port, start_site, wait_until_up
from tests.recordings import (
    ANSWERS,
    KEY,
    MESSAGES,
    answer_by_model,
    cli,
    config_for,
    fake_upstream,
    record_two,
)

db_url = dbs.db_url  # fixture
CONTENT = ANSWERS["gpt-4o-mini"]["choices"][0]["message"]["content"]


def sdk(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)


async def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.post(url + "/v1/chat/completions", data=orjson.dumps(body)) as response,
    ):
        return response.status, dict(response.headers), await response.read()


async def playback_process(
    url: str, cwd: Path, *flags: str
) -> tuple[asyncio.subprocess.Process, str]:
    """`flightrec playback --db URL FLAGS` running on a free port; the process and its root."""
    with reserved_port() as port:  # until playback listens on it
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", "playback", "--port", str(port), "--db", url,
            *flags, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        root = f"http://127.0.0.1:{port}"
        try:
            await wait_until_up(root + "/healthz", process)
        except BaseException:
            process.kill()
            await process.wait()
            raise
    return process, root


async def test_recorded_answers_without_an_upstream(db_url: str, tmp_path: Path) -> None:
    async with fake_upstream() as upstream:
        answer_by_model(upstream)
        config = config_for(db_url, upstream.url, tmp_path, port=0)
        recorded = await record_two(config)
    # The upstream is gone from here on.

    async with playing(config, PlaybackOptions()) as running, sdk(running.url) as client:
        assert running.recorded == 2
        plain = await client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini",
            messages=MESSAGES,
        )
        assert plain.headers["X-Flightrec-Id"] == recorded.plain_id
        assert plain.headers["X-Flightrec-Playback"] == "recorded"
        assert orjson.loads(plain.http_response.content) == ANSWERS["gpt-4o-mini"]
        assert plain.parse().choices[0].message.content == CONTENT

        stream = await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=MESSAGES,
            stream=True,
        )
        chunks = [chunk async for chunk in stream]
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == CONTENT
        assert chunks[-1].choices[0].finish_reason == "stop"

        # A raw client gets the very bytes the recorded client got (keys in another order).
        body = {"stream": True, "messages": MESSAGES, "model": "gpt-4o-mini"}
        status, headers, data = await post(running.url, body)
        assert (status, headers["X-Flightrec-Id"]) == (200, recorded.stream_id)
        assert headers["Content-Type"].startswith("text/event-stream")
        assert data == recorded.stream_bytes

        with pytest.raises(openai.NotFoundError) as missed:
            await client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[{"role": "user", "content": "Something never asked"}],
            )
        assert missed.value.code == "playback_miss"
        async with aiohttp.ClientSession() as session, session.get(running.url + "/healthz") as r:
            assert r.status == 200


async def test_recorded_pacing(tmp_path: Path) -> None:
    url = dbs.sqlite_url(tmp_path / "p.db")
    async with fake_upstream(piece_size=30, pause=0.01) as upstream:
        config = config_for(url, upstream.url, tmp_path, port=0)
        recorded = await record_two(config)
    raw = await _raw(url, recorded.stream_id)
    assert raw is not None
    data, pacing = raw
    assert data == recorded.stream_bytes and len(pacing) >= 3  # one write per event
    recorded_ms = pacing[-1][1]
    body = {"model": "gpt-4o-mini", "messages": MESSAGES, "stream": True}
    for timing in ("recorded", "fast"):
        async with playing(config, PlaybackOptions(timing=timing)) as running:
            started = time.monotonic()
            status, _, played = await post(running.url, body)
            elapsed_ms = (time.monotonic() - started) * 1000
        assert (status, played) == (200, recorded.stream_bytes)
        if timing == "recorded":
            assert elapsed_ms >= recorded_ms * 0.9
        else:
            assert elapsed_ms < recorded_ms / 2


async def _raw(url: str, exchange_id: str) -> tuple[bytes, list[tuple[int, float]]] | None:
    async with reading(url) as engine:
        return await get_raw_stream(engine, exchange_id)


def test_canonical_body() -> None:
    a = {"model": "m", "messages": [{"role": "user", "content": "x", "name": "a"}], "user": "u1"}
    b = {"user": "u2", "messages": [{"content": "x", "role": "user", "name": "b"}], "model": "m"}
    assert canonical(a) != canonical(b)
    assert canonical(a, ("user", "messages.name")) == canonical(b, ("user", "messages.name"))
    assert (
        canonical(a, ("user",))
        == b'{"messages":[{"content":"x","name":"a","role":"user"}],"model":"m"}'
    )
    assert canonical(None) == b""


async def test_newest_wins_and_ignore_fields(tmp_path: Path) -> None:
    url = dbs.sqlite_url(tmp_path / "p.db")
    async with fake_upstream() as upstream:
        config = config_for(url, upstream.url, tmp_path, port=0)
        await record_two(config)
        upstream.completion = ANSWERS["gpt-4o"]
        newer = await record_two(config)
    asked = {"model": "gpt-4o-mini", "messages": MESSAGES, "temperature": 0.5, "user": "u-9"}
    async with playing(config, PlaybackOptions()) as running:
        status, headers, data = await post(
            running.url, {k: asked[k] for k in ("model", "messages")}
        )
        assert (status, headers["X-Flightrec-Id"]) == (200, newer.plain_id)
        assert orjson.loads(data) == ANSWERS["gpt-4o"]
        status, _, data = await post(running.url, asked)
        assert status == 404 and orjson.loads(data)["error"]["code"] == "playback_miss"
    async with playing(config, PlaybackOptions(ignore_fields=("temperature", "user"))) as running:
        status, headers, _ = await post(running.url, asked)
        assert (status, headers["X-Flightrec-Id"]) == (200, newer.plain_id)


async def test_miss_forwarded_and_recorded(db_url: str, tmp_path: Path) -> None:
    async with fake_upstream() as upstream:
        answer_by_model(upstream)
        config = config_for(db_url, upstream.url, tmp_path, port=0)
        recorded = await record_two(config)
        seen = len(upstream.seen)
        async with (
            playing(config, PlaybackOptions(miss="forward")) as running,
            sdk(running.url) as client,
        ):
            hit = await client.chat.completions.with_raw_response.create(
                model="gpt-4o-mini",
                messages=MESSAGES,
            )
            missed = await client.chat.completions.with_raw_response.create(
                model="gpt-4o",
                messages=MESSAGES,
            )
        assert len(upstream.seen) == seen + 1  # only the miss went upstream
    assert hit.headers["X-Flightrec-Id"] == recorded.plain_id
    assert "X-Flightrec-Playback" not in missed.headers
    assert missed.parse().choices[0].message.content.startswith("Green")  # type: ignore[union-attr]
    async with reading(db_url) as engine:
        shown = await get_exchange(engine, missed.headers["X-Flightrec-Id"])
        assert (shown["model"], shown["outcome"]) == ("gpt-4o", "ok")
        assert len(await list_exchanges(engine)) == 3


async def test_playback_command(tmp_path: Path) -> None:
    url = dbs.sqlite_url(tmp_path / "p.db")
    async with fake_upstream() as upstream:
        answer_by_model(upstream)
        recorded = await record_two(config_for(url, upstream.url, tmp_path))
    process, root = await playback_process(url, tmp_path, "--match", "ignore-fields=user")
    try:
        async with sdk(root) as client:
            answer = await client.chat.completions.with_raw_response.create(
                model="gpt-4o-mini",
                messages=MESSAGES,
                user="anyone",
            )
        assert answer.headers["X-Flightrec-Id"] == recorded.plain_id
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err.decode()
    assert b"2 recorded requests" in err


async def test_playback_bad_match_is_a_usage_error(tmp_path: Path) -> None:
    run = await cli("playback", "--match", "fuzzy", cwd=tmp_path)
    assert run.code == 2 and "Invalid value for '--match'" in run.err, run.err


async def _record_failures_then_success(url: str, tmp_path: Path) -> list[str]:
    """The same request three times through a real proxy: the upstream answers 429, then
    500, then the completion; the exchanges' ids, in that order."""
    async with fake_upstream() as upstream:
        answers = iter([429, 500, 200])

        async def flaky(request: web.Request) -> web.Response:
            status = next(answers)
            if status == 200:
                return web.json_response(ANSWERS["gpt-4o-mini"])
            kind = "rate_limit_exceeded" if status == 429 else "server_error"
            error = {"message": f"upstream {status}", "type": kind, "param": None, "code": kind}
            return web.json_response({"error": error}, status=status)

        upstream.override = flaky
        config = config_for(url, upstream.url, tmp_path)
        await upgrade(url)
        app = build_app(config, DatabaseRecorder(config))
        runner = make_runner(app, config)
        await runner.setup()
        root = await start_site(runner)
        ids = []
        try:
            for _ in range(3):
                _, headers, _ = await post(root, {"model": "gpt-4o-mini", "messages": MESSAGES})
                ids.append(headers["X-Flightrec-Id"])
        finally:
            await runner.cleanup()
    return ids


async def test_playback_errors_plays_recorded_failures_for_retry_logic(tmp_path: Path) -> None:
    """`playback --errors` (a real process) answers the recorded 429 and 500 before the
    recorded success, as the upstream did, so a client's retries meet them and then succeed;
    without it, only the success is played back."""
    url = dbs.sqlite_url(tmp_path / "p.db")
    failed_429, failed_500, ok = await _record_failures_then_success(url, tmp_path)
    runs: tuple[tuple[list[str], list[str], list[int], list[str | None]], ...] = (
        (["--errors"], [failed_429, failed_500, ok], [429, 500, 200], ["rate_limit_exceeded"]),
        ([], [ok], [200], [None]),
    )
    for flags, served, statuses, codes in runs:
        process, root = await playback_process(url, tmp_path, *flags)
        try:
            body = {"model": "gpt-4o-mini", "messages": MESSAGES}
            seen = [await post(root, body) for _ in range(len(served) + 1)]
        finally:
            process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(process.communicate(), 30)
        # Each request's answers in the order recorded, the last one again once they run out.
        assert [headers["X-Flightrec-Id"] for _, headers, _ in seen] == [*served, ok]
        assert [status for status, _, _ in seen] == [*statuses, 200]
        assert orjson.loads(seen[0][2]).get("error", {}).get("code") == codes[0]
