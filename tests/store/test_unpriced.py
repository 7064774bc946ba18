"""Paid requests without usage (speech, image generation) are unpriced, never $0, in every
report: `flightrec cost`, `cost_report` (behind `/api/cost`) and `cost_series`. Recorded the
way users make them: the real `openai` SDK through the real proxy, on both engines."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import openai
import orjson
from aiohttp import web
from click.testing import CliRunner

from proxy.cli.main import main
from proxy.relay.app import build_app, make_runner
from proxy.store import create_engine, upgrade
from proxy.store.recorder import DatabaseRecorder
from proxy.store.report import cost_report
from proxy.store.series import cost_series
from tests import dbs
from tests.conftest import start_site
from tests.recordings import KEY, config_for, fake_upstream

db_url = dbs.db_url  # fixture


async def answer(request: web.Request) -> web.StreamResponse:
    """Speech as audio bytes, images as JSON, both without usage; a 429 for `dall-e-2`."""
    body = await request.read()
    if request.path.endswith("/audio/speech"):
        return web.Response(body=b"ID3\x00fake-mp3", content_type="audio/mpeg")
    if request.path.endswith("/models"):
        return web.json_response({"object": "list", "data": []})
    if request.path.endswith("/moderations"):
        result = {"id": "modr-1", "model": "omni-moderation-latest", "results": []}
        return web.json_response(result)
    if orjson.loads(body)["model"] == "dall-e-2":
        return web.json_response({"error": {"message": "slow down"}}, status=429)
    return web.json_response({"created": 1, "data": [{"url": "https://img.example/1.png"}]})


async def record_paid_without_usage(db_url: str, tmp_path: Path) -> None:
    async with fake_upstream() as fake:
        fake.override = answer
        config = config_for(db_url, fake.url, tmp_path)
        await upgrade(db_url)
        runner = make_runner(build_app(config, DatabaseRecorder(config)), config)
        await runner.setup()
        url = await start_site(runner)
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        try:
            speech = await client.audio.speech.create(
                model="gpt-4o-mini-tts", voice="alloy", input="Hello"
            )
            assert speech.content.startswith(b"ID3")
            await client.images.generate(model="dall-e-3", prompt="a cat")
            with contextlib.suppress(openai.RateLimitError):  # an upstream error is free
                await client.images.generate(model="dall-e-2", prompt="a cat")
            await client.moderations.create(model="omni-moderation-latest", input="hi")
            await client.models.list()  # names no model: costs nothing
        finally:
            await client.close()
            await runner.cleanup()  # the recorder writes everything out


async def test_speech_and_images_are_unpriced_not_free(db_url: str, tmp_path: Path) -> None:
    await record_paid_without_usage(db_url, tmp_path)
    engine = create_engine(db_url)
    try:
        rows = {row["group"]: row for row in await cost_report(engine, "model")}
        series = await cost_series(engine, "model", "day")
    finally:
        await engine.dispose()
    found = {g: (r["requests"], r["cost_usd"], r["unpriced_requests"]) for g, r in rows.items()}
    assert found == {
        "gpt-4o-mini-tts": (1, None, 1),
        "dall-e-3": (1, None, 1),
        "dall-e-2": (1, 0, 0),  # a 429
        "omni-moderation-latest": (1, 0, 0),
        None: (1, 0, 0),  # GET /models
    }
    points = {s["group"]: s["points"] for s in series["series"]}
    assert [p[1] for p in points["gpt-4o-mini-tts"]] == [None]
    assert [p[1] for p in points["dall-e-3"]] == [None]

    result = await asyncio.to_thread(
        CliRunner().invoke, main, ["cost"], env={"FLIGHTREC_DB_URL": db_url}
    )
    assert result.exit_code == 0, result.output
    table = {line.split()[0]: line.split() for line in result.stdout.splitlines()}
    assert table["gpt-4o-mini-tts"][-2:] == ["unpriced", "1"]
    assert table["dall-e-3"][-2:] == ["unpriced", "1"]
    assert table["TOTAL"][-2:] == ["0.00", "2"]
