"""A fake OpenAI WebSocket upstream: a real aiohttp server on a free port that speaks the
Realtime API (`/v1/realtime`) and the Responses API's WebSocket mode (`/v1/responses`) with
the event shapes of the installed `openai` SDK's own types (every event it sends is validated
against `RealtimeServerEvent` / `ResponsesServerEvent` first, so a test cannot pass on a shape
OpenAI does not send).

Deterministic: ids count up per connection and times are fixed, so the frames a client gets
directly and through the proxy can be compared one for one. What a response holds is chosen by
its request: the Realtime `response.create`'s `response.instructions` (`text`, `audio`,
`tool`, `slow`: `pause` between deltas, `slower`: four times that), the Responses `input`
(`slow`; anything else is answered at once).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pydantic
from aiohttp import WSMsgType, web
from openai.types.realtime import RealtimeServerEvent
from openai.types.responses.responses_server_event import ResponsesServerEvent

from tests.conftest import start_site

Json = dict[str, Any]
_REALTIME = pydantic.TypeAdapter(RealtimeServerEvent)
_RESPONSES = pydantic.TypeAdapter(ResponsesServerEvent)
CREATED_AT = 1_764_000_000
AUDIO = bytes(range(256)) * 30
"""7,680 bytes of 24 kHz 16-bit mono: 0.16 s."""


def realtime_usage(text_in: int, audio_in: int, cached: int, text_out: int, audio_out: int) -> Json:
    return {
        "total_tokens": text_in + audio_in + text_out + audio_out,
        "input_tokens": text_in + audio_in,
        "output_tokens": text_out + audio_out,
        "input_token_details": {
            "text_tokens": text_in,
            "audio_tokens": audio_in,
            "image_tokens": 0,
            "cached_tokens": cached,
            "cached_tokens_details": {"text_tokens": cached, "audio_tokens": 0, "image_tokens": 0},
        },
        "output_token_details": {"text_tokens": text_out, "audio_tokens": audio_out},
    }


@dataclass
class WsUpstream:
    url: str = ""
    """Root URL, `http://127.0.0.1:<port>`; the SDK's base URL is `url + "/v1"`."""
    refuse: tuple[int, bytes] | None = None
    """Answer every handshake with this status and JSON body."""
    beta: bool = False
    """Realtime: send the beta event names (`response.text.delta`, ...)."""
    leave_mid_response: bool = False
    """Drop the connection (no close frame) after a response's first delta."""
    pause: float = 0.0
    """Seconds between the events of a `slow` response."""
    handshakes: list[dict[str, str]] = field(default_factory=list)
    """The headers of each handshake, as received."""
    received: list[Any] = field(default_factory=list)
    """Every frame received, parsed when text."""
    binary_echo: bool = True
    """Answer a binary frame with the same bytes reversed."""
    closes: list[int | None] = field(default_factory=list)
    """The close code of each session, as the fake saw it end."""
    flooded: int = 0
    """Binary frames of a flood (`{"type": "flood", "count", "size"}`) whose send completed."""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.handshakes.append(dict(request.headers))
        if self.refuse is not None:
            status, body = self.refuse
            return web.Response(status=status, body=body, content_type="application/json")
        ws = web.WebSocketResponse(protocols=("realtime",), max_msg_size=0)
        await ws.prepare(request)
        session: _Session
        if request.path.endswith("/realtime"):
            session = _Realtime(self, ws, request.query.get("model", "gpt-realtime"))
        else:
            session = _Responses(self, ws)
        with contextlib.suppress(ConnectionError):
            await session.run()
        return ws


class _Session:
    def __init__(self, fake: WsUpstream, ws: web.WebSocketResponse) -> None:
        self.fake = fake
        self.ws = ws
        self.count = 0

    def next_id(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}_{self.count:04d}"

    async def run(self) -> None:
        await self.opened()
        async for msg in self.ws:
            if msg.type is WSMsgType.BINARY:
                self.fake.received.append(msg.data)
                if self.fake.binary_echo:
                    await self.ws.send_bytes(msg.data[::-1])
            elif msg.type is WSMsgType.TEXT:
                event = orjson.loads(msg.data)
                self.fake.received.append(event)
                if event.get("type") == "flood":
                    await self.flood(event["count"], event["size"])
                elif event.get("type") == "close":  # the upstream closes, with this code
                    await self.ws.close(code=event["code"], message=event["reason"].encode())
                else:
                    await self.on_event(event)
        self.fake.closes.append(self.ws.close_code)

    async def flood(self, count: int, size: int) -> None:
        """`count` binary frames of `size` bytes, each starting with its number, sent as fast
        as the connection takes them."""
        for n in range(count):
            await self.ws.send_bytes(n.to_bytes(4, "big") + bytes(size - 4))
            self.fake.flooded += 1

    async def opened(self) -> None:
        pass

    async def on_event(self, event: Json) -> None:
        raise NotImplementedError

    async def send(self, event: Json, adapter: pydantic.TypeAdapter[Any]) -> None:
        adapter.validate_python(event)
        await self.ws.send_str(orjson.dumps(event).decode())

    async def leave(self) -> None:
        """Vanish: the connection drops without a close frame."""
        transport = self.ws._req.transport if self.ws._req is not None else None
        if transport is not None:
            transport.abort()
        raise ConnectionError("left")


class _Realtime(_Session):
    def __init__(self, fake: WsUpstream, ws: web.WebSocketResponse, model: str) -> None:
        super().__init__(fake, ws)
        self.session: Json = {
            "type": "realtime",
            "object": "realtime.session",
            "id": "sess_fake",
            "model": model,
            "output_modalities": ["audio"],
            "instructions": "Be brief.",
            "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": 24000}},
                "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin"},
            },
        }

    def name(self, ga: str, beta: str) -> str:
        return beta if self.fake.beta else ga

    async def emit(self, event: Json) -> None:
        event["event_id"] = self.next_id("event")
        await self.send(event, _REALTIME) if not self.fake.beta else await self._send_beta(event)

    async def _send_beta(self, event: Json) -> None:
        # The beta names are not in the GA types: checked under their GA name.
        ga = {
            "response.text.delta": "response.output_text.delta",
            "response.audio.delta": "response.output_audio.delta",
            "response.audio_transcript.delta": "response.output_audio_transcript.delta",
        }.get(event["type"], event["type"])
        _REALTIME.validate_python({**event, "type": ga})
        await self.ws.send_str(orjson.dumps(event).decode())

    async def opened(self) -> None:
        await self.emit({"type": "session.created", "session": self.session})

    async def on_event(self, event: Json) -> None:
        kind = event.get("type")
        if kind == "session.update":
            self.session.update(event.get("session") or {})
            await self.emit({"type": "session.updated", "session": self.session})
        elif kind == "conversation.item.create":
            item = {**event["item"], "id": self.next_id("item"), "object": "realtime.item"}
            item.setdefault("status", "completed")
            await self.emit(
                {"type": "conversation.item.added", "previous_item_id": None, "item": item}
            )
        elif kind == "response.create":
            await self.respond((event.get("response") or {}).get("instructions") or "text")

    async def respond(self, what: str) -> None:
        rid = self.next_id("resp")
        base = {"object": "realtime.response", "id": rid, "conversation_id": "conv_fake"}
        await self.emit(
            {
                "type": "response.created",
                "response": {**base, "status": "in_progress", "output": []},
            }
        )
        item_id = self.next_id("item")
        if what == "tool":
            item, usage = await self._tool(rid, item_id), realtime_usage(40, 0, 0, 12, 0)
        elif what == "audio":
            item, usage = await self._audio(rid, item_id), realtime_usage(20, 30, 8, 6, 25)
        else:
            item, usage = await self._text(rid, item_id, what), realtime_usage(15, 0, 0, 4, 0)
        done = {**base, "status": "completed", "output": [item], "usage": usage}
        done["output_modalities"] = ["audio" if what == "audio" else "text"]
        await self.emit({"type": "response.done", "response": done})

    async def _text(self, rid: str, item_id: str, what: str) -> Json:
        where = {"response_id": rid, "item_id": item_id, "output_index": 0, "content_index": 0}
        for delta in ("Hello", " wörld", " 🚀"):
            await self.emit(
                {
                    "type": self.name("response.output_text.delta", "response.text.delta"),
                    **where,
                    "delta": delta,
                }
            )
            if self.fake.leave_mid_response:
                await self.leave()
            if what in ("slow", "slower"):
                await asyncio.sleep(self.fake.pause * (4 if what == "slower" else 1))
        content = [{"type": "output_text", "text": "Hello wörld 🚀"}]
        return {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": content,
        }

    async def _audio(self, rid: str, item_id: str) -> Json:
        where = {"response_id": rid, "item_id": item_id, "output_index": 0, "content_index": 0}
        for start in (0, len(AUDIO) // 2):
            chunk = base64.b64encode(AUDIO[start : start + len(AUDIO) // 2]).decode()
            await self.emit(
                {
                    "type": self.name("response.output_audio.delta", "response.audio.delta"),
                    **where,
                    "delta": chunk,
                }
            )
            await self.emit(
                {
                    "type": self.name(
                        "response.output_audio_transcript.delta", "response.audio_transcript.delta"
                    ),
                    **where,
                    "delta": "Hi there" if start == 0 else "!",
                }
            )
        content = [{"type": "output_audio", "transcript": "Hi there!"}]
        return {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": content,
        }

    async def _tool(self, rid: str, item_id: str) -> Json:
        where = {"response_id": rid, "item_id": item_id, "output_index": 0, "call_id": "call_1"}
        for delta in ('{"city"', ': "Paris"}'):
            await self.emit(
                {"type": "response.function_call_arguments.delta", **where, "delta": delta}
            )
        await self.emit(
            {
                "type": "response.function_call_arguments.done",
                **where,
                "name": "weather",
                "arguments": '{"city": "Paris"}',
            }
        )
        return {
            "id": item_id,
            "object": "realtime.item",
            "type": "function_call",
            "status": "completed",
            "name": "weather",
            "call_id": "call_1",
            "arguments": '{"city": "Paris"}',
        }


class _Responses(_Session):
    def __init__(self, fake: WsUpstream, ws: web.WebSocketResponse) -> None:
        super().__init__(fake, ws)
        self.known: set[str] = set()
        self.sequence = 0

    async def emit(self, event: Json, lane: str | None) -> None:
        event["sequence_number"] = self.sequence
        self.sequence += 1
        if lane is not None:
            event["stream_id"] = lane
        await self.send(event, _RESPONSES)

    async def on_event(self, event: Json) -> None:
        if event.get("type") != "response.create":
            return
        lane = event.get("stream_id")
        previous = event.get("previous_response_id")
        if previous is not None and previous not in self.known:
            error = {
                "type": "invalid_request_error",
                "code": "previous_response_not_found",
                "message": f"Previous response with id '{previous}' not found.",
                "param": "previous_response_id",
            }
            await self.emit({"type": "error", "error": error, "status": 400}, lane)
            return
        await self.respond(event, lane)

    async def respond(self, create: Json, lane: str | None) -> None:
        rid = self.next_id("resp")
        self.known.add(rid)
        head: Json = {
            "id": rid,
            "object": "response",
            "created_at": CREATED_AT,
            "model": "gpt-4.1-2025-04-14",
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "previous_response_id": create.get("previous_response_id"),
        }
        await self.emit(
            {
                "type": "response.created",
                "response": {**head, "status": "in_progress", "output": []},
            },
            lane,
        )
        item_id = self.next_id("msg")
        where = {"item_id": item_id, "output_index": 0, "content_index": 0}
        item = {
            "id": item_id,
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        await self.emit(
            {"type": "response.output_item.added", "output_index": 0, "item": item}, lane
        )
        await self.emit(
            {
                "type": "response.content_part.added",
                **where,
                "part": {"type": "output_text", "text": "", "annotations": []},
            },
            lane,
        )
        words = ["Turn", " ", rid[-1], " ✓"]
        for word in words:
            await self.emit(
                {"type": "response.output_text.delta", **where, "delta": word, "logprobs": []}, lane
            )
            if self.fake.leave_mid_response:
                await self.leave()
            if create.get("input") == "slow":
                await asyncio.sleep(self.fake.pause)
        text = "".join(words)
        part = {"type": "output_text", "text": text, "annotations": []}
        await self.emit(
            {"type": "response.output_text.done", **where, "text": text, "logprobs": []}, lane
        )
        await self.emit({"type": "response.content_part.done", **where, "part": part}, lane)
        done_item = {**item, "status": "completed", "content": [part]}
        await self.emit(
            {"type": "response.output_item.done", "output_index": 0, "item": done_item}, lane
        )
        usage = {
            "input_tokens": 30,
            "input_tokens_details": {"cached_tokens": 10, "cache_write_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 35,
        }
        final = {**head, "status": "completed", "output": [done_item], "usage": usage}
        await self.emit({"type": "response.completed", "response": final}, lane)


class _SseResponses(_Responses):
    """The same events as the streamed `POST /v1/responses` gives them (Server-Sent Events)."""

    def __init__(self, fake: WsUpstream, response: web.StreamResponse) -> None:
        super().__init__(fake, web.WebSocketResponse())
        self.response = response

    async def send(self, event: Json, adapter: pydantic.TypeAdapter[Any]) -> None:
        adapter.validate_python(event)
        data = orjson.dumps(event)
        await self.response.write(
            b"event: " + event["type"].encode() + b"\ndata: " + data + b"\n\n"
        )


async def _post_responses(request: web.Request) -> web.StreamResponse:
    create = orjson.loads(await request.read())
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await _SseResponses(request.app[_FAKE], response).respond(create, None)
    await response.write_eof()
    return response


_FAKE = web.AppKey("fake", WsUpstream)


@contextlib.asynccontextmanager
async def ws_upstream(fake: WsUpstream | None = None) -> AsyncIterator[WsUpstream]:
    """`fake` served on a free port while the block runs."""
    fake = fake or WsUpstream()
    app = web.Application()
    app[_FAKE] = fake
    app.router.add_get("/v1/realtime", fake.handle)
    app.router.add_get("/v1/responses", fake.handle)
    app.router.add_post("/v1/responses", _post_responses)
    app.router.add_get("/v1/other", fake.handle)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    try:
        fake.url = await start_site(runner)
        yield fake
    finally:
        await runner.cleanup()


async def _serve_forever(port: int, pause: float) -> None:
    fake = WsUpstream(pause=pause)
    app = web.Application()
    for path in ("/v1/realtime", "/v1/responses"):
        app.router.add_get(path, fake.handle)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


if __name__ == "__main__":  # `python -m tests.wsfake PORT PAUSE`: the fake in its own process
    import sys

    asyncio.run(_serve_forever(int(sys.argv[1]), float(sys.argv[2])))
