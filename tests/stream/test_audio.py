"""Audio uploads through the proxy to the database, with the real openai SDK as the client: the
model of a transcription is a multipart form field, and the exchange is priced by it."""

from __future__ import annotations

from decimal import Decimal
from email import policy
from email.parser import BytesParser
from typing import Any

import orjson
from aiohttp import web

from tests.conftest import FakeUpstream, Sdk
from tests.relay.test_record_e2e import Recording, db_url, query, recording

__all__ = ["db_url", "recording"]  # fixtures

AUDIO = b"RIFF\x24\x00\x00\x00WAVEfmt " + bytes(range(256)) * 4  # binary, with CRLFs inside
TEXT = "Bonjour à tous, ça va ? 👋"
USAGE = {
    "type": "tokens",
    "input_tokens": 120,
    "input_token_details": {"text_tokens": 20, "audio_tokens": 100},
    "output_tokens": 45,
    "total_tokens": 165,
}
# genai-prices 0.2.3, gpt-4o-mini-transcribe: input 1.25, input audio 3.00, output 5.00 per 1M.
COST = Decimal("0.00055")  # 20 x 1.25 + 100 x 3.00 + 45 x 5.00
STREAM_USAGE = {**USAGE, "input_tokens": 14, "input_token_details": {"audio_tokens": 14}}
STREAM_COST = Decimal("0.000267")  # 14 x 3.00 + 45 x 5.00


def read_form(content_type: str, body: bytes) -> dict[str, bytes]:
    """A multipart form's parts by name, read by the standard library's MIME parser."""
    head = f"Content-Type: {content_type}\r\n\r\n".encode()
    message = BytesParser(policy=policy.HTTP).parsebytes(head + body)
    assert message.is_multipart()
    parts: dict[str, bytes] = {}
    for part in message.iter_parts():
        payload = part.get_payload(decode=True)
        assert isinstance(payload, bytes)
        parts[str(part.get_param("name", header="content-disposition"))] = payload
    return parts


async def transcriptions(request: web.Request) -> web.StreamResponse:
    """As OpenAI answers: JSON, or with `stream=true` events ending in one with usage."""
    form = read_form(request.headers["Content-Type"], await request.read())
    assert form["file"] == AUDIO
    if form.get("stream") != b"true":
        return web.json_response({"text": TEXT, "usage": USAGE})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for piece in (TEXT[:9], TEXT[9:]):
        event = {"type": "transcript.text.delta", "delta": piece}
        await response.write(b"data: " + orjson.dumps(event) + b"\n\n")
    done = {"type": "transcript.text.done", "text": TEXT, "usage": STREAM_USAGE}
    await response.write(b"data: " + orjson.dumps(done) + b"\n\n")
    return response


async def test_transcriptions_are_recorded_with_their_model_and_priced(
    upstream: FakeUpstream, recording: Recording, sdk: Sdk
) -> None:
    upstream.override = transcriptions
    client = sdk(recording.base_url, "sk-audio-0123456789", max_retries=0)
    model = "gpt-4o-mini-transcribe"
    plain = await client.audio.transcriptions.create(model=model, file=("a.wav", AUDIO))
    deltas: list[Any] = []
    stream = await client.audio.transcriptions.create(
        model=model, file=("a.wav", AUDIO), stream=True
    )
    async for event in stream:
        deltas.append(event)
    assert plain.text == TEXT and deltas[-1].text == TEXT
    await recording.stop()

    rows = await query(
        recording.db_url,
        "SELECT e.model, e.response_model, e.stream, e.outcome, e.cost_usd, e.price_entry, "
        "e.request_body IS NOT NULL, u.prompt_tokens, u.completion_tokens "
        "FROM exchanges e JOIN usage u ON u.exchange_id = e.id ORDER BY e.id",
    )
    entry = "genai-prices 0.2.3 openai/gpt-4o-mini-transcribe standard"
    # The answer names no model, so `response_model` stays null and the requested one is priced.
    assert rows == [
        (model, None, False, "ok", float(COST), entry, True, 120, 45),
        (model, None, True, "ok", float(STREAM_COST), entry, True, 14, 45),
    ]
