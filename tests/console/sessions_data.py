"""Conversations recorded through the real proxy with the real `openai` SDK, for the session
tests: a chat continued over three turns without any header (the SDK resends the whole
conversation, as clients do), an unrelated chat, two requests sharing `X-Flightrec-Session`,
and a Responses API chain by `previous_response_id`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from proxy.exchange import Exchange
from tests.conftest import FakeUpstream, ProxyFactory, Sdk, completion, until
from tests.console_data import HOSTILE

QUESTIONS = ["What is a flight recorder?", "Who reads it?", HOSTILE]


@dataclass
class Talks:
    chat: list[Exchange]
    other: Exchange
    header: list[Exchange]
    responses: list[Exchange]

    def all(self) -> list[Exchange]:
        return [*self.chat, self.other, *self.header, *self.responses]


def _last_user(payload: dict[str, Any]) -> str:
    users = [m.get("content") for m in payload.get("messages", []) if m.get("role") == "user"]
    return str(users[-1]) if users else ""


async def _answer(request: web.Request) -> web.Response:
    """Chat: "Answer N: <question>" with usage; Responses: an id per call, chained."""
    payload = orjson.loads(await request.read())
    if request.path == "/v1/responses":
        n = 1 if payload.get("previous_response_id") is None else 2
        body = {"id": f"resp_{n}", "object": "response", "model": "gpt-4o-mini", "status":
                "completed", "output": [{"type": "message", "role": "assistant", "content": [
                    {"type": "output_text", "text": f"reply {n}", "annotations": []}]}],
                "usage": {"input_tokens": 10, "output_tokens": 3, "total_tokens": 13}}  # fmt: skip
        return web.json_response(body)
    turns = sum(1 for m in payload["messages"] if m.get("role") == "user")
    found = completion(id=f"chatcmpl-{turns}", model="gpt-4o-mini-2024-07-18")
    found["choices"][0]["message"]["content"] = f"Answer {turns}: {_last_user(payload)[:40]}"
    found["usage"] = {"prompt_tokens": 20 * turns, "completion_tokens": 7, "total_tokens": 0}
    return web.json_response(found)


async def talk(upstream: FakeUpstream, make_proxy: ProxyFactory, sdk: Sdk) -> Talks:
    upstream.override = _answer
    proxy = await make_proxy()
    client = sdk(proxy.base_url, "sk-test-sessions-1234")
    messages: list[Any] = [{"role": "system", "content": "You are terse."}]
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        done = await client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        messages.append({"role": "assistant", "content": done.choices[0].message.content})
    await client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "Unrelated"}]
    )
    for text in ("first", "second"):
        await client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": text}],
            extra_headers={"X-Flightrec-Session": "sess-42"},
        )
    first = await client.responses.create(model="gpt-4o-mini", input="Start")
    await client.responses.create(model="gpt-4o-mini", input="Go on", previous_response_id=first.id)
    recorded = proxy.recorder.exchanges
    await until(lambda: len(recorded) == 8)
    found = sorted(recorded, key=lambda ex: ex.started_at)
    return Talks(found[:3], found[3], found[4:6], found[6:8])
