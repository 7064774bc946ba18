"""The drop-in promise: through the proxy, the real openai SDK gets exactly what it gets direct,
and the recorder gets the complete exchange."""

from __future__ import annotations

import asyncio
import gc
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web
from openai.types.chat import ChatCompletionMessageParam
from yarl import URL

from proxy.exchange import Exchange
from proxy.relay import record
from tests.conftest import FakeUpstream, RunningProxy, Sdk, completion

KEY = "sk-test-0123456789abcdefWXYZ"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Say hello"}]


def _logprob(token: str, top: int) -> dict[str, Any]:
    entry = {"token": token, "logprob": -0.25, "bytes": list(token.encode())}
    alts = [{"token": f"{token}{i}", "logprob": -1.5 - i, "bytes": None} for i in range(top)]
    return {**entry, "top_logprobs": alts}


def _choice(index: int, **message: Any) -> dict[str, Any]:
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    logprobs = message.pop("logprobs", None)
    body = {"role": "assistant", "content": None, "refusal": None, **message}
    return {"index": index, "message": body, "logprobs": logprobs, "finish_reason": finish}


SCENARIOS: dict[str, dict[str, Any]] = {
    "plain": completion(),
    "n3": completion(
        choices=[_choice(i, content=f"Answer {i}: ünïcode 世界 {'!' * i}") for i in range(3)]
    ),
    "parallel_tools": completion(
        choices=[
            _choice(
                0,
                tool_calls=[
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "get_stock", "arguments": '{"ticker": "AAPL"}'},
                    },
                ],
            )
        ]
    ),
    "logprobs": completion(
        choices=[
            _choice(
                0,
                content="Foo bar.",
                logprobs={
                    "content": [_logprob(t, 2) for t in ("Foo", " bar", ".")],
                    "refusal": None,
                },
            )
        ]
    ),
    "refusal": completion(
        choices=[_choice(0, refusal="I'm sorry, I can't help with that.")],
        usage={
            "prompt_tokens": 17,
            "completion_tokens": 11,
            "total_tokens": 28,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
        },
    ),
}


async def _sdk_results(
    base_url: str, *, sync: bool, stream: bool, include_usage: bool
) -> list[dict[str, Any]]:
    kwargs: dict[str, Any] = {"model": "gpt-4o-mini", "messages": MESSAGES}
    if stream:
        kwargs["stream"] = True
        if include_usage:
            kwargs["stream_options"] = {"include_usage": True}
    if sync:

        def call() -> list[dict[str, Any]]:
            with openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0) as client:
                result = client.chat.completions.create(**kwargs)
                if stream:
                    return [chunk.model_dump() for chunk in result]
                return [result.model_dump()]

        return await asyncio.to_thread(call)
    async with openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0) as client:
        result = await client.chat.completions.create(**kwargs)
        if stream:
            return [chunk.model_dump() async for chunk in result]
        return [result.model_dump()]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
@pytest.mark.parametrize(
    ("stream", "include_usage"),
    [(False, False), (True, False), (True, True)],
    ids=["json", "stream", "stream+usage"],
)
async def test_sdk_sees_what_it_sees_direct(
    upstream: FakeUpstream,
    proxy: RunningProxy,
    scenario: str,
    sync: bool,
    stream: bool,
    include_usage: bool,
) -> None:
    upstream.completion = SCENARIOS[scenario]
    direct = await _sdk_results(upstream.url, sync=sync, stream=stream, include_usage=include_usage)
    through = await _sdk_results(
        proxy.base_url, sync=sync, stream=stream, include_usage=include_usage
    )
    assert through == direct
    if include_usage:
        expected = openai.types.CompletionUsage.model_validate(SCENARIOS[scenario]["usage"])
        assert through[-1]["usage"] == expected.model_dump()

    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.outcome == "ok" and exchange.status == 200
    assert exchange.stream is stream
    # Streamed or not, the record holds the chat.completion a non-streaming call returns,
    # usage included even when the client did not ask for it.
    assert exchange.response_json == SCENARIOS[scenario]
    assert exchange.usage == SCENARIOS[scenario]["usage"]
    expected_source = "injected" if stream and not include_usage else "reported"
    assert exchange.usage_source == expected_source
    assert exchange.model == "gpt-4o-mini"
    assert exchange.response_model == "gpt-4o-mini-2024-07-18"
    assert exchange.system_fingerprint == "fp_test"
    assert exchange.key_hint == "sk-...WXYZ" and KEY not in repr(exchange)
    assert exchange.upstream_request_id == "req_fake123"
    assert exchange.parse_errors == []
    if stream:
        assert exchange.chunks == len(upstream.sent.split(b"\n\n")) - 1
        assert exchange.ttft_ms is not None and exchange.ttfb_ms is not None
        assert exchange.ttft_ms >= exchange.ttfb_ms


async def test_raw_stream_is_kept_only_when_configured(
    upstream: FakeUpstream, make_proxy: Any, sdk: Sdk
) -> None:
    for keep in (True, False):
        proxy = await make_proxy(store_raw_stream=keep)
        client = sdk(proxy.base_url, KEY)
        async for _ in await client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True
        ):
            pass
        await client.chat.completions.create(model="m", messages=MESSAGES)
        streamed, plain = await proxy.recorder.wait_for(2)
        assert (streamed.raw_stream_gz is not None) is keep
        assert plain.raw_stream_gz is None and plain.raw_pacing is None


async def test_upstream_is_asked_for_usage_only_when_the_client_did_not(
    upstream: FakeUpstream, make_proxy: Any, sdk: Sdk
) -> None:
    proxy = await make_proxy()
    client = sdk(proxy.base_url, KEY)
    async for _ in await client.chat.completions.create(model="m", messages=MESSAGES, stream=True):
        pass
    assert b'"stream_options":{"include_usage":true}' in upstream.seen[-1].body

    # The client's own bytes go up with the one key added; an option object of its own is
    # merged (a key twice in one object is not JSON every parser takes).
    async with aiohttp.ClientSession() as session:
        for sent, expected in (
            (
                b'{"model": "m", "stream": true, "n": 1.50, "x": "\\u00e9"}\n',
                b'{"model": "m", "stream": true, "n": 1.50, "x": "\\u00e9","stream_options":'
                b'{"include_usage":true}}',
            ),
            (
                b'{"model":"m","stream":true,"stream_options":{"other":1}}',
                b'{"model":"m","stream":true,"stream_options":{"other":1,"include_usage":true}}',
            ),
            (
                b'{"model":"m","stream":true,"stream_options":null}',
                b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}',
            ),
            (  # the key spelled with an escape: parsed, so still a stream that gets usage
                b'{"model":"m","str\\u0065am":true}',
                b'{"model":"m","str\\u0065am":true,"stream_options":{"include_usage":true}}',
            ),
            (  # a long body: the same bytes go up
                b'{"model":"m","prompt":"' + b"x" * 9000 + b'", "stream":true}',
                b'{"model":"m","prompt":"' + b"x" * 9000 + b'", "stream":true'
                b',"stream_options":{"include_usage":true}}',
            ),
        ):
            async with session.post(f"{proxy.base_url}/chat/completions", data=sent) as response:
                await response.read()
            assert upstream.seen[-1].body == expected

    passthrough = await make_proxy(stream_usage="passthrough")
    client = sdk(passthrough.base_url, KEY)
    chunks = [
        c
        async for c in await client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True
        )
    ]
    assert b"stream_options" not in upstream.seen[-1].body
    assert all(c.usage is None for c in chunks)
    [exchange] = await passthrough.recorder.wait_for(1)
    assert exchange.usage is None and exchange.usage_source == "missing"
    assert exchange.response_json["choices"] == upstream.completion["choices"]


async def test_a_stream_key_of_a_nested_object_asks_for_no_stream(
    upstream: FakeUpstream, proxy: RunningProxy
) -> None:
    """A "stream": true of a nested object asks for no stream: the request goes up once, as it
    came, and the client sees what it would have seen without the proxy."""
    sent = orjson.dumps({"model": "m", "messages": MESSAGES, "response_format": {"stream": True}})
    url = f"{proxy.base_url}/chat/completions"
    async with aiohttp.ClientSession() as session, session.post(url, data=sent) as response:
        assert response.status == 200
        assert await response.json() == upstream.completion
    [answered] = upstream.seen
    assert answered.body == sent
    [exchange] = await proxy.recorder.wait_for(1)
    assert (exchange.status, exchange.outcome, exchange.stream) == (200, "ok", False)
    assert exchange.request_body == sent and exchange.usage_source == "reported"

    # Any other refusal is the client's answer, sent once; an upstream that takes the option
    # answers no stream, and its usage is its own.
    async def busy(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "slow down"}}, status=429)

    async def lenient(request: web.Request) -> web.Response:
        return web.json_response(upstream.completion)

    for recorded, (handler, status, source) in enumerate(
        ((busy, 429, None), (lenient, 200, "reported")), start=2
    ):
        upstream.override = handler
        before = len(upstream.seen)
        async with aiohttp.ClientSession() as session, session.post(url, data=sent) as response:
            assert response.status == status
        assert len(upstream.seen) == before + 1
        exchange = (await proxy.recorder.wait_for(recorded))[-1]
        assert (exchange.status, exchange.usage_source) == (status, source)


def _received(sock: Any) -> int:
    """Bytes that have reached `sock` so far, read by its owner or not (Linux `tcp_info`:
    `tcpi_bytes_received`, after 8 one-byte fields, 24 32-bit ones and 3 64-bit ones)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return int(struct.unpack_from("Q", info, 128)[0])


async def test_the_record_is_made_once_the_answer_is_on_its_way_to_the_client(
    upstream: FakeUpstream, proxy: RunningProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Filling the exchange waits until the answer's first piece has been written to the
    client (it would delay that piece otherwise); the id was minted when the request came,
    the record still says when that was, and what the upstream answered."""
    upstream.by_event = True
    upstream.pause = 0.05
    client_socket: list[Any] = []
    received_then: list[int] = []
    made_at: list[float] = []

    def watched_start(*args: Any, **kwargs: Any) -> Exchange:
        made_at.append(time.time())
        received_then.append(_received(client_socket[0]))
        return Exchange(*args, **kwargs)

    monkeypatch.setattr(record, "Exchange", watched_start)  # what `Record` makes its with
    address = URL(proxy.base_url)
    reader, writer = await asyncio.open_connection(address.host, address.port)
    client_socket.append(writer.get_extra_info("socket"))
    ids = []
    for stream in (b"false", b"true"):
        body = b'{"model":"m","messages":[],"stream":%s}' % stream
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body)
        )
        head = await reader.readuntil(b"\r\n\r\n")
        ids.append(head.split(b"X-Flightrec-Id: ")[1].split(b"\r\n")[0].decode())
        if stream == b"false":
            await reader.readexactly(int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]))
        else:
            await reader.readuntil(b"0\r\n\r\n")
    writer.close()
    plain, streamed = await proxy.recorder.wait_for(2)
    # Each record was made after the answer's first bytes had reached the client.
    assert received_then[0] > 0 and received_then[1] > received_then[0]
    assert [plain.id, streamed.id] == ids and plain.id < streamed.id
    assert streamed.started_at < made_at[1]
    assert streamed.request_body == b'{"model":"m","messages":[],"stream":true}'
    assert streamed.upstream_url == upstream.url + "/chat/completions"
    assert (streamed.status, streamed.content_type) == (200, "text/event-stream")
    assert streamed.stream and streamed.ttfb_ms is not None and streamed.ttfb_ms > 0


def _late_end(body: bytes) -> Callable[[web.Request], Any]:
    """An upstream that sends the whole stream at once and ends its body 300 ms later: the
    SDK stops at `[DONE]` and closes the response before the body's end reaches it."""

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(body)
        await asyncio.sleep(0.3)
        await response.write_eof()
        return response

    return answer


def _responses_stream(text: str) -> bytes:
    """A short Responses API stream, as OpenAI sends it: no [DONE], a terminal event."""
    final = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": "completed",
        "model": "gpt-4.1",
        "output": [
            {
                "id": "msg_1",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
    }
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {**final, "status": "in_progress"}},
        {
            "type": "response.output_text.delta",
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": text,
        },
        {"type": "response.completed", "response": final},
    ]
    return b"".join(
        b"event: %s\ndata: %s\n\n" % (e["type"].encode(), orjson.dumps({**e, "sequence_number": n}))
        for n, e in enumerate(events)
    )


async def _stream_sdk(base_url: str, *, sync: bool, api: str) -> str:
    """One stream through a fresh client, as a CLI makes it: the text it got. Chat streams
    end where the SDK stops, at [DONE]; a Responses stream where the caller stops reading,
    at its terminal event (the SDK itself would read on to the body's end)."""
    chat: dict[str, Any] = {"model": "m", "messages": MESSAGES, "stream": True}
    if api == "chat+usage":
        chat["stream_options"] = {"include_usage": True}

    def text_of(item: Any) -> str:
        if api == "responses":
            return str(getattr(item, "delta", ""))
        return "".join(c.delta.content or "" for c in item.choices)

    def call_sync() -> str:
        client = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0)
        try:
            create = client.chat.completions.create
            if api == "responses":
                stream: Any = client.responses.create(model="m", input="hi", stream=True)
            else:
                stream = create(**chat)
            with stream:
                got = []
                for item in stream:
                    got.append(text_of(item))
                    if getattr(item, "type", "") == "response.completed":
                        break
                return "".join(got)
        finally:
            client.close()

    async def call_async() -> str:
        async with openai.AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0) as client:
            if api == "responses":
                stream: Any = await client.responses.create(model="m", input="hi", stream=True)
            else:
                stream = await client.chat.completions.create(**chat)
            async with stream:
                got = []
                async for item in stream:
                    got.append(text_of(item))
                    if getattr(item, "type", "") == "response.completed":
                        break
                return "".join(got)

    return await asyncio.to_thread(call_sync) if sync else await call_async()


@pytest.mark.parametrize("api", ["chat", "chat+usage", "responses"])
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_streams_the_sdk_closes_after_the_final_event_are_recorded_ok(
    upstream: FakeUpstream, proxy: RunningProxy, sync: bool, api: str
) -> None:
    """A CLI makes a fresh client per call and closes the response as soon as the final event
    has come: the client has the whole answer, so the exchange is `ok`, whatever the socket
    does after (here the upstream's body ends 300 ms later)."""
    streams = 20
    text = upstream.completion["choices"][0]["message"]["content"]
    if api == "responses":
        upstream.override = _late_end(_responses_stream(text))
    else:
        upstream.override = _late_end(upstream.stream_body(include_usage=True))
    for _ in range(streams):
        assert await _stream_sdk(proxy.base_url, sync=sync, api=api) == text
    recorded = await proxy.recorder.wait_for(streams, within=20)
    assert [(ex.outcome, ex.error) for ex in recorded] == [("ok", None)] * streams
    assert all(ex.usage is not None for ex in recorded)


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_an_sdk_client_leaving_mid_stream_is_client_disconnected(
    upstream: FakeUpstream, proxy: RunningProxy, sync: bool
) -> None:
    body = upstream.stream_body(include_usage=True)
    first = body[: body.index(b"\n\n") + 2]

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(first)
        await asyncio.sleep(5)  # the client leaves before: the proxy cancels this
        await response.write(body[len(first) :])
        return response

    upstream.override = answer
    kwargs: dict[str, Any] = {"model": "m", "messages": MESSAGES, "stream": True}

    def leave_sync() -> None:
        with (
            openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0) as client,
            client.chat.completions.create(**kwargs) as stream,
        ):
            next(iter(stream))

    async def leave_async() -> None:
        async with (
            openai.AsyncOpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0) as client,
            await client.chat.completions.create(**kwargs) as stream,
        ):
            await anext(aiter(stream))

    await asyncio.to_thread(leave_sync) if sync else await leave_async()
    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.outcome == "client_disconnected"
    assert exchange.response_bytes == len(first.replace(b',"usage":null', b""))


async def test_an_exchange_leaves_no_reference_cycle_behind(
    upstream: FakeUpstream, proxy: RunningProxy
) -> None:
    """Everything an exchange made is freed when its last reference goes, not by the cyclic
    collector: objects in a cycle live (and are traversed) until a collection finds them."""
    url = f"{proxy.base_url}/chat/completions"
    streamed = orjson.dumps({"model": "m", "messages": MESSAGES, "stream": True})
    plain = orjson.dumps({"model": "m", "messages": MESSAGES})
    async with aiohttp.ClientSession() as session:
        for body in (streamed, plain):  # the first of each kind warms what stays
            async with session.post(url, data=body) as response:
                await response.read()
        await proxy.recorder.wait_for(2)
        gc.collect()
        gc.disable()
        try:
            for _ in range(5):
                for body in (streamed, plain):
                    async with session.post(url, data=body) as response:
                        await response.read()
            await proxy.recorder.wait_for(12)
            proxy.recorder.exchanges.clear()
            await asyncio.sleep(0.05)
            left = gc.collect()
        finally:
            gc.enable()
    assert left == 0
