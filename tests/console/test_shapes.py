"""The console shows every kind of exchange, not only chat completions: a Responses API answer
(reasoning summary, function call, message text, refusal, other items), a legacy completion,
a transcription and embeddings, recorded through the real proxy with the real `openai` SDK;
and its text search finds Responses answers, function calls and transcripts."""

from __future__ import annotations

import html
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from proxy.relay.app import build_app, make_runner
from proxy.store import upgrade
from proxy.store.recorder import DatabaseRecorder
from tests.conftest import start_site
from tests.console_data import HOSTILE, console_app
from tests.dbs import sqlite_url
from tests.recordings import KEY, config_for, fake_upstream

Client = TestClient[Any, Any]

RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1_760_000_000,
    "status": "completed",
    "model": "gpt-5-mini-2025-08-07",
    "output": [
        {"id": "rs_1", "type": "reasoning",
         "summary": [{"type": "summary_text", "text": "Weighing the forecast " + HOSTILE}]},
        {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_9",
         "name": "get_weather", "arguments": '{"city":"Paris","unit":"c"}'},
        {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "Sunny in Paris, says the ocelot.",
                      "annotations": []}]},
        {"id": "msg_2", "type": "message", "status": "completed", "role": "assistant",
         "content": [{"type": "refusal", "refusal": "I won't guess tomorrow's lottery."}]},
        {"id": "ws_1", "type": "web_search_call", "status": "completed",
         "action": {"type": "search", "query": "paris weather"}},
    ],
    "usage": {"input_tokens": 20, "input_tokens_details": {"cached_tokens": 4},
              "output_tokens": 30, "output_tokens_details": {"reasoning_tokens": 10},
              "total_tokens": 50},
}  # fmt: skip
COMPLETION = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 1_760_000_000,
    "model": "gpt-3.5-turbo-instruct",
    "choices": [{"text": " Hello from the legacy endpoint", "index": 0, "logprobs": None,
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7},
}  # fmt: skip
TRANSCRIPT = {"text": "The quick brown fox jumps over the lazy dog."}
EMBEDDINGS = {
    "object": "list",
    "data": [{"object": "embedding", "index": i, "embedding": [0.25, -0.5, 0.125]} for i in (0, 1)],
    "model": "text-embedding-3-small",
    "usage": {"prompt_tokens": 2, "total_tokens": 2},
}
ANSWERS = {
    "/v1/responses": RESPONSE,
    "/v1/completions": COMPLETION,
    "/v1/audio/transcriptions": TRANSCRIPT,
    "/v1/embeddings": EMBEDDINGS,
}


@dataclass
class Shapes:
    responses: str
    completion: str
    transcription: str
    embeddings: str


async def answer(request: web.Request) -> web.StreamResponse:
    return web.Response(body=orjson.dumps(ANSWERS[request.path]), content_type="application/json")


async def record_shapes(db_url: str, tmp_path: Path) -> Shapes:
    """One exchange of each shape, sent by the `openai` SDK through a real proxy."""
    await upgrade(db_url)
    async with fake_upstream() as fake:
        fake.override = answer
        config = config_for(db_url, fake.url, tmp_path)
        runner = make_runner(build_app(config, DatabaseRecorder(config)), config)
        await runner.setup()
        url = await start_site(runner)
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
        try:
            responses = await client.responses.with_raw_response.create(
                model="gpt-5-mini",
                instructions="Answer in one line.",
                input=[
                    {"role": "user", "content": "Weather in Paris?"},
                    {"type": "function_call_output", "call_id": "call_0", "output": "rain"},
                ],
            )
            legacy = await client.completions.with_raw_response.create(
                model="gpt-3.5-turbo-instruct", prompt="Say hello"
            )
            heard = await client.audio.transcriptions.with_raw_response.create(
                model="whisper-1", file=("fox.wav", b"RIFF\x00\xff\xfe audio", "audio/wav")
            )
            vectors = await client.embeddings.with_raw_response.create(
                model="text-embedding-3-small", input=["a", "b"], encoding_format="float"
            )
        finally:
            await client.close()
            await runner.cleanup()  # the recorder writes everything out
    return Shapes(*(r.headers["X-Flightrec-Id"] for r in (responses, legacy, heard, vectors)))


@pytest.fixture
async def shapes(aiohttp_client: Any, tmp_path: Path) -> AsyncIterator[tuple[Client, Shapes]]:
    url = sqlite_url(tmp_path / "shapes.db")
    recorded = await record_shapes(url, tmp_path)
    yield await aiohttp_client(console_app(url)), recorded


def section(page: str, title: str) -> str:
    """The text of the page's section under the heading `title` (up to the next one)."""
    start = page.index(f"<h2>{title}")
    return html.unescape(page[start : page.index("</section>", start)])


async def test_a_responses_answer_is_rendered_by_item(shapes: tuple[Client, Shapes]) -> None:
    client, s = shapes
    page = await (await client.get(f"/exchanges/{s.responses}")).text()
    asked = section(page, "Conversation")
    assert "Answer in one line." in asked and "Weather in Paris?" in asked
    assert "call_0" in asked and "rain" in asked
    answer = section(page, "Answer")
    assert answer.startswith("<h2>Answers (5 output items)</h2>"), answer[:40]
    assert "No answer" not in answer and "No choices" not in answer
    assert "Sunny in Paris, says the ocelot." in answer
    assert "Weighing the forecast" in answer and "reasoning" in answer
    assert "get_weather" in answer and '"city": "Paris"' in answer  # formatted arguments
    assert "Refusal:" in answer and "I won't guess tomorrow's lottery." in answer
    assert "web_search_call" in answer and '"query": "paris weather"' in answer
    assert "&lt;script&gt;window.pwned" in page and "<script>window" not in page
    assert "20 prompt (4 cached), 30 completion (10 reasoning)" in page


async def test_other_endpoints_show_their_answer(shapes: tuple[Client, Shapes]) -> None:
    client, s = shapes
    page = await (await client.get(f"/exchanges/{s.completion}")).text()
    assert "Say hello" in section(page, "Conversation")
    assert "Hello from the legacy endpoint" in section(page, "Answer")
    page = await (await client.get(f"/exchanges/{s.transcription}")).text()
    assert "The quick brown fox jumps over the lazy dog." in section(page, "Answer")
    assert "No messages" not in page and "form upload" in section(page, "Conversation")
    page = await (await client.get(f"/exchanges/{s.embeddings}")).text()
    assert "2 embeddings of 3 dimensions" in section(page, "Answer")


async def ids(client: Client, q: str) -> list[str]:
    body = await (await client.get("/api/exchanges", params={"q": q})).json()
    return [item["id"] for item in body["items"]]


async def test_search_finds_answers_beyond_chat(shapes: tuple[Client, Shapes]) -> None:
    client, s = shapes
    assert await ids(client, "SAYS THE OCELOT") == [s.responses]
    assert await ids(client, "get_weather") == [s.responses]
    assert await ids(client, "lazy dog") == [s.transcription]
    assert await ids(client, "legacy endpoint") == [s.completion]
    assert await ids(client, "nothing says this") == []
    page = await (
        await client.get("/exchanges", params={"q": "brown fox"})
    ).text()  # the list page too
    assert s.transcription in page and s.responses not in page
