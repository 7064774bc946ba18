"""The tee: bytes through the proxy are the upstream's bytes, as soon as they arrive."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import random
import time
from collections.abc import Callable
from typing import Any, Literal

import aiohttp
import orjson
import pytest
from aiohttp import web

from proxy.exchange import Exchange
from proxy.relay.deferred import Deferred
from proxy.relay.tee import StreamTee
from proxy.stream.chat import ChatAssembler
from proxy.stream.endpoints import endpoint
from proxy.stream.reader import BodySettings
from proxy.stream.withhold import whole_events, without_null_usage, without_usage_events
from tests.conftest import FakeUpstream, RunningProxy, captures
from tests.streamgen import chunks_to_sse, completion_to_chunks, cut_bytes

UTF8_HEAVY = "Ünïcödé — 世界の皆さん、こんにちは 🚀🎉 ½ ∑ ñ"


def _request(stream: bool = True, include_usage: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]}
    if stream:
        body["stream"] = True
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    return body


async def _post_raw(base_url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.post(base_url + "/chat/completions", json=body) as response,
    ):
        return response.status, dict(response.headers), await response.read()


def _less_usage_event(body: bytes) -> bytes:
    """The SSE body without its usage-only event (`"choices":[]` with a usage object) and
    the `"usage":null` members of its other chunks."""
    events = body.split(b"\n\n")
    kept = [e for e in events if not (b'"choices":[]' in e and b'"usage":{' in e)]
    assert len(kept) == len(events) - 1, "expected exactly one usage event"
    return b"\n\n".join(kept).replace(b',"usage":null', b"")


@pytest.mark.parametrize("piece_size", [1, 7, None, "event"])
@pytest.mark.parametrize("include_usage", [True, False])
async def test_stream_bytes_are_the_upstreams(
    upstream: FakeUpstream,
    proxy: RunningProxy,
    piece_size: int | Literal["event"] | None,
    include_usage: bool,
) -> None:
    upstream.completion["choices"][0]["message"]["content"] = UTF8_HEAVY * 3
    if piece_size == "event":  # whole events go out before they are parsed; usage never does
        upstream.by_event, upstream.pause = True, 0.002
    else:
        upstream.piece_size = piece_size
    _, _, direct = await _post_raw(upstream.url, _request(True, include_usage))
    status, headers, received = await _post_raw(proxy.base_url, _request(True, include_usage))
    assert status == 200
    sent = bytes(upstream.sent)
    assert b'"usage":{' in sent  # the proxy asked for usage either way
    # The client gets what it gets without the proxy: when the proxy asked for usage, the
    # usage event and the `"usage":null` the upstream added to every chunk are not its.
    assert received == direct
    assert received == (sent if include_usage else _less_usage_event(sent))
    [exchange] = await proxy.recorder.wait_for(1)
    assert headers["X-Flightrec-Id"] == exchange.id
    assert exchange.response_bytes == len(received)
    assert gzip.decompress(exchange.raw_stream_gz or b"") == received  # for byte-exact playback
    pacing = exchange.raw_pacing or []
    assert pacing[-1][0] == len(received)
    assert all(a[0] < b[0] and a[1] <= b[1] for a, b in itertools.pairwise(pacing))
    assert exchange.response_json["choices"][0]["message"]["content"] == UTF8_HEAVY * 3


@pytest.mark.parametrize("piece_size", [1, None])
async def test_json_bytes_are_the_upstreams(
    upstream: FakeUpstream, proxy: RunningProxy, piece_size: int | None
) -> None:
    upstream.completion["choices"][0]["message"]["content"] = UTF8_HEAVY
    upstream.piece_size = piece_size
    status, _, received = await _post_raw(proxy.base_url, _request(stream=False))
    assert status == 200 and received == bytes(upstream.sent)
    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.response_json == upstream.completion


@pytest.mark.parametrize("include_usage", [True, False])
async def test_first_event_reaches_client_before_upstream_sends_the_second(
    upstream: FakeUpstream, proxy: RunningProxy, include_usage: bool
) -> None:
    release = asyncio.Event()
    first = b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",'
    first += b'"choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"}}]}\n\n'
    second = b'data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'

    async def paused(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(first)
        await asyncio.wait_for(release.wait(), 10)  # only the client can release it
        await response.write(second + b"data: [DONE]\n\n")
        return response

    upstream.override = paused
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            proxy.base_url + "/chat/completions", json=_request(True, include_usage)
        ) as response,
    ):
        got = await asyncio.wait_for(response.content.readuntil(b"\n\n"), 5)
        assert got == first
        release.set()
        rest = await response.read()
    assert rest == second + b"data: [DONE]\n\n"


async def test_client_disconnect_cancels_upstream_and_records_partial(
    upstream: FakeUpstream, proxy: RunningProxy
) -> None:
    cancelled = asyncio.Event()
    first = b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m",'
    first += b'"choices":[{"index":0,"delta":{"role":"assistant","content":"Partial"}}]}\n\n'

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(first)
        try:
            await asyncio.sleep(30)
        finally:  # cancelled when the proxy drops the upstream connection
            cancelled.set()
        return response

    upstream.override = endless
    session = aiohttp.ClientSession()
    response = await session.post(proxy.base_url + "/chat/completions", json=_request())
    assert await response.content.readuntil(b"\n\n") == first
    response.close()
    await session.close()

    [exchange] = await proxy.recorder.wait_for(1, within=5)
    assert exchange.outcome == "client_disconnected"
    assert exchange.response_json["choices"][0]["message"]["content"] == "Partial"
    # Cancelled, not left to run out its 30 s.
    await asyncio.wait_for(cancelled.wait(), 10)


async def test_client_disconnect_without_cancel_records_the_whole_completion(
    upstream: FakeUpstream, make_proxy: Any
) -> None:
    """With cancel_on_disconnect = false the proxy reads on: the user pays for those tokens."""
    proxy = await make_proxy(cancel_on_disconnect=False)
    upstream.completion["choices"][0]["message"]["content"] = "word " * 200
    upstream.piece_size = 64
    upstream.pause = 0.002
    session = aiohttp.ClientSession()
    response = await session.post(proxy.base_url + "/chat/completions", json=_request())
    await response.content.readuntil(b"\n\n")
    response.close()
    await session.close()
    [exchange] = await proxy.recorder.wait_for(1, within=10)
    assert exchange.outcome == "client_disconnected"
    assert exchange.response_json["choices"][0]["message"]["content"] == "word " * 200
    assert exchange.usage == upstream.completion["usage"]


def _sdk_accumulate(body: bytes) -> Any:
    """What the openai SDK's own accumulator builds from these SSE bytes."""
    from openai.lib.streaming.chat._completions import ChatCompletionStreamState
    from openai.types.chat import ChatCompletionChunk

    state: Any = ChatCompletionStreamState()
    for block in body.split(b"\n\n"):
        data = block.removeprefix(b"data: ")
        if block and data != b"[DONE]":
            state.handle_chunk(ChatCompletionChunk.model_validate(orjson.loads(data)))
    return state.get_final_completion()


@pytest.mark.parametrize("capture", captures())
@pytest.mark.parametrize("include_usage", [True, False])
async def test_live_captures_pass_byte_exact_and_reassemble_like_the_sdk(
    upstream: FakeUpstream, proxy: RunningProxy, capture: Any, include_usage: bool
) -> None:
    body = capture.read_bytes()
    upstream.sse_body = body
    upstream.piece_size = random.Random(capture.stem).randint(1, 40)
    status, _, received = await _post_raw(proxy.base_url, _request(True, include_usage))
    assert status == 200
    assert received == (body if include_usage else _less_usage_event(body))

    [exchange] = await proxy.recorder.wait_for(1)
    record = exchange.response_json
    sdk = _sdk_accumulate(body)
    assert exchange.outcome == "ok" and exchange.parse_errors == []
    assert exchange.usage_source == ("reported" if include_usage else "injected")
    assert (record["id"], record["model"], record["created"]) == (sdk.id, sdk.model, sdk.created)
    assert record["system_fingerprint"] == sdk.system_fingerprint
    assert record["usage"] == sdk.usage.model_dump(exclude_unset=True)
    assert len(record["choices"]) == len(sdk.choices)
    for mine, theirs in zip(record["choices"], sdk.choices, strict=True):
        message = mine["message"]
        # A key the stream never carried is not in the record (a missing refusal reads None).
        assert (message["content"], message.get("refusal")) == (
            theirs.message.content,
            theirs.message.refusal,
        )
        assert mine["finish_reason"] == theirs.finish_reason
        calls = [
            (c.id, c.type, c.function.name, c.function.arguments)
            for c in theirs.message.tool_calls or []
        ]
        mine_calls = [
            (c["id"], c["type"], c["function"]["name"], c["function"]["arguments"])
            for c in message.get("tool_calls", [])
        ]
        assert mine_calls == calls
        for kind in ("content", "refusal"):
            theirs_lp = getattr(theirs.logprobs, kind, None) if theirs.logprobs else None
            mine_lp = (mine["logprobs"] or {}).get(kind)
            assert [t["token"] for t in mine_lp or []] == [t.token for t in theirs_lp or []]


QUIRK_HEAD = (
    b'data: {"id":"q1","object":"chat.completion.chunk","created":5,"model":"m",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}\n\n'
)


@pytest.mark.parametrize(
    ("tail", "outcome", "error_part"),
    [
        pytest.param(b"data: [DONE]\n\n", "ok", None, id="complete"),
        pytest.param(b"", "upstream_disconnected", "[DONE]", id="no-done"),
        pytest.param(
            b'data: {"error": {"message": "overloaded", "type": "server_error"}}\n\n',
            "stream_error",
            "overloaded",
            id="error-event",
        ),
    ],
)
async def test_stream_endings_are_recorded_with_what_came_before(
    upstream: FakeUpstream, proxy: RunningProxy, tail: bytes, outcome: str, error_part: str | None
) -> None:
    body = QUIRK_HEAD + b": keep-alive\n\ndata: not json at all\n\n" + tail
    upstream.sse_body = body
    status, _, received = await _post_raw(proxy.base_url, _request(True, include_usage=True))
    assert status == 200 and received == body  # the client gets everything, bad line included
    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.outcome == outcome
    if error_part is None:
        assert exchange.error is None
    else:
        assert error_part in (exchange.error or "")
    assert exchange.response_json["choices"][0]["message"]["content"] == "Hel"
    assert any("not JSON" in problem for problem in exchange.parse_errors)


@pytest.mark.parametrize("by_event", [False, True], ids=["byte-by-byte", "by-event"])
async def test_withheld_usage_event_with_crlf(
    upstream: FakeUpstream, proxy: RunningProxy, by_event: bool
) -> None:
    chunks: list[dict[str, Any]] = [
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}],
            "usage": None,
        },
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        },
    ]
    body = chunks_to_sse(chunks).replace(b"\n", b"\r\n")
    upstream.sse_body = body
    if by_event:
        upstream.by_event, upstream.pause = True, 0.002
    else:
        upstream.piece_size = 1
    _, _, received = await _post_raw(proxy.base_url, _request(True, include_usage=False))
    events = body.split(b"\r\n\r\n")
    first = events[0].replace(b',"usage":null', b"")
    assert received == b"\r\n\r\n".join([first, *events[2:]])
    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.usage == chunks[1]["usage"] and exchange.usage_source == "injected"


async def test_malformed_chunks_never_break_the_relay_or_the_rest_of_the_record(
    upstream: FakeUpstream, proxy: RunningProxy
) -> None:
    bad = [
        b'data: {"choices": ["not a choice"]}\n\n',
        b'data: {"choices": [{"index": 0, "delta": "not a delta"}]}\n\n',
        b'data: {"choices": [{"index": 0, "delta": {"tool_calls": [7]}}]}\n\n',
        b"data: [1, 2]\n\n",
    ]
    tail = b'data: {"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}\n\n'
    body = QUIRK_HEAD + b"".join(bad) + tail + b"data: [DONE]\n\n"
    upstream.sse_body = body
    status, _, received = await _post_raw(proxy.base_url, _request(True, include_usage=True))
    assert status == 200 and received == body
    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.outcome == "ok"
    assert len(exchange.parse_errors) == len(bad)
    choice = exchange.response_json["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("Hello", "stop")


class Client:
    """What the tee writes to: keeps the bytes, until it has gone."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.gone = False

    async def write(self, data: bytes) -> None:
        if self.gone:
            raise ConnectionResetError("gone")
        self.received += data


class Writes(Client):
    """A client that keeps each write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []

    async def write(self, data: bytes) -> None:
        await super().write(data)
        self.writes.append(data)


def _tee(path: str, *, sse: bool, withhold: bool = False, **options: Any) -> StreamTee:
    settings: dict[str, Any] = {"max_record_bytes": 1 << 20, **options}
    client = settings.pop("client", None) or Client()
    later = settings.pop("later", None)
    body = BodySettings(
        endpoint(path),
        "",
        sse=sse,
        injected=withhold,
        withhold=withhold,
        started=time.perf_counter(),
        **settings,
    )
    return StreamTee(
        Exchange.start("POST", "/v1" + path, "", "openai"), client.write, body, later=later
    )


def _chat_tee(later: Deferred | None, *, withhold: bool, client: Client | None = None) -> StreamTee:
    return _tee(
        "/chat/completions", sse=True, later=later, withhold=withhold, keep_raw=True, client=client
    )


@pytest.mark.parametrize(
    ("piece", "passes"),
    [
        (b'data: {"choices":[{"index":0}],"usage":null}\n\n', True),
        (b'data: {"choices": [], "usage" : null }\r\n\r\n', True),
        (b'data: {"choices":[],"usage":{"total_tokens":3}}\n\n', True),
        (b'data: {"choices": [], "usage": {"total_tokens": 3}}\n\n', True),
        (b'data: {"choices":[{"index":0}],"usage":null}\n', False),  # ends inside an event
        (b'data: {"usage":null}\n\ndata: {"choices":[],"usage":{"total_tokens":3}}\n\n', True),
        (b'data: {"choices":[],"usage":{"total_tokens":3}}\n\ndata: {"a":', False),
        (b'data: {"usage":null}\n\ndata: {"usage": null}\n\n', True),
        (b"data: [DONE]\n\n", True),
    ],
)
async def test_what_may_go_out_before_it_is_parsed(piece: bytes, passes: bool) -> None:
    tee = _chat_tee(None, withhold=True)
    assert tee.passes(piece) is passes
    await tee.relay(b'data: {"choices":[{"index":0,"delta":{"content":"a')  # half an event
    assert not tee.passes(piece)  # nothing goes ahead of the bytes held back


def _chunk(content: str | None, **choice: Any) -> dict[str, Any]:
    delta = {"content": content} if content is not None else {}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o",
        "choices": [{"index": 0, "delta": delta, "finish_reason": None, **choice}],
    }


async def test_pieces_the_client_has_are_read_a_moment_later_as_they_came() -> None:
    """Work done right after a write delays the client reading it: the tee reads such pieces
    when `Deferred` runs, in order, and times them by when they came."""
    later = Deferred(delay=0.05)
    before = time.perf_counter()
    client = Client()
    tee = _chat_tee(later, withhold=False, client=client)
    pieces = [
        chunks_to_sse([_chunk("Hel")], done=False),
        chunks_to_sse([_chunk("lo")], done=False),
        chunks_to_sse([_chunk(None, finish_reason="stop")]),
    ]
    assert await tee.relay(pieces[0])
    came = time.perf_counter()
    assert await tee.relay(pieces[1])
    exchange = tee.exchange
    assert (exchange.chunks, exchange.response_bytes, exchange.ttft_ms) == (0, 0, None)
    later.flush()  # what the timer does `delay` from now
    assert exchange.chunks == 2 and exchange.response_bytes == len(pieces[0] + pieces[1])
    assert exchange.ttft_ms is not None and exchange.ttft_ms <= (came - before) * 1000

    client.gone = True
    assert not await tee.relay(pieces[2])  # not counted as received
    await tee.end(whole=False)  # nothing was held back: the rest waits for `finish`
    tee.finish()  # before `Deferred` ran: reads what waits first
    assert exchange.chunks == 4  # the last chunk and [DONE]
    assert exchange.response_json["choices"][0]["message"]["content"] == "Hello"
    assert gzip.decompress(exchange.raw_stream_gz or b"") == pieces[0] + pieces[1]
    assert client.received == pieces[0] + pieces[1] and exchange.response_bytes == len(
        client.received
    )
    assert (exchange.outcome, exchange.parse_errors) == ("client_disconnected", [])


@pytest.mark.parametrize("withhold", [False, True])
async def test_a_body_that_has_ended_is_read_by_finish_not_at_a_moment_of_its_own(
    withhold: bool,
) -> None:
    """Once the body has ended, the record's other work (`finish`, run by `Deferred` with it)
    reads what waits: a read of its own, 0.5 ms after the last write, lands on a lone client's
    next request."""
    reads = Deferred(delay=60)
    tee = _chat_tee(reads, withhold=withhold)
    stream = chunks_to_sse([_chunk("Hi"), _chunk(None, finish_reason="stop")])
    assert await tee.relay(stream)
    await tee.end(whole=True)
    reads.flush()  # the read's moment comes after the end: nothing is read then
    exchange = tee.exchange
    assert (exchange.chunks, exchange.response_json) == (0, None)
    tee.finish()
    assert exchange.chunks == 3 and exchange.outcome == "ok"
    assert exchange.response_json["choices"][0]["message"]["content"] == "Hi"
    assert exchange.response_bytes == len(stream)


@pytest.mark.parametrize("withhold", [False, True])
async def test_a_piece_that_ends_the_body_books_no_read_of_its_own(withhold: bool) -> None:
    """A body in one piece (a non-streamed answer, a short stream) has ended when that piece
    goes out: `finish` reads it, and no timer is booked to fire inside the next exchange."""
    reads = Deferred(delay=60)
    tee = _chat_tee(reads, withhold=withhold)
    stream = chunks_to_sse([_chunk("Hi"), _chunk(None, finish_reason="stop")])
    assert await tee.relay(stream, last=True)
    assert len(reads) == 0
    await tee.end(whole=True)
    tee.finish()
    exchange = tee.exchange
    assert exchange.chunks == 3 and exchange.outcome == "ok"
    assert exchange.response_json["choices"][0]["message"]["content"] == "Hi"
    assert exchange.response_bytes == len(stream)
    assert gzip.decompress(exchange.raw_stream_gz or b"") == stream

    more = _chat_tee(reads, withhold=withhold)
    assert await more.relay(chunks_to_sse([_chunk("Hi")], done=False))  # more may come
    assert len(reads) == 1


async def test_withholding_reads_waiting_pieces_before_the_one_it_must_look_at() -> None:
    client = Client()
    tee = _chat_tee(Deferred(delay=60), withhold=True, client=client)
    first = chunks_to_sse([_chunk("Hi")], done=False)
    assert tee.passes(first)
    await tee.relay(first)
    usage = chunks_to_sse([{**_chunk(None), "choices": [], "usage": {"total_tokens": 3}}])
    half = usage[:20]
    assert tee.passes(first) and tee.passes(usage) and not tee.passes(usage[:20])
    await tee.relay(half)
    assert client.received == first  # the usage event starts: held back
    assert tee.exchange.chunks == 1  # the waiting piece was read first
    assert not tee.passes(first)  # in the middle of an event now
    # The body ends in the middle of the event: what was held goes out at once.
    await tee.end(whole=True)
    assert client.received == first + half
    tee.finish()
    assert tee.exchange.response_json["choices"][0]["message"]["content"] == "Hi"


async def test_a_stream_in_one_piece_goes_out_in_one_write_before_it_is_read() -> None:
    """A short stream can come in one piece, usage event and all: it goes out at once, in one
    write, as it would have come without the option (the usage event cut out by parsing that
    event alone), and the record reads it a moment later."""
    client = Writes()
    tee = _chat_tee(Deferred(delay=60), withhold=True, client=client)
    content = [_chunk("Hi"), _chunk(None, finish_reason="stop")]
    usage = {**_chunk(None), "choices": [], "usage": {"total_tokens": 3}}
    with_null = [{**chunk, "usage": None} for chunk in content]
    await tee.relay(chunks_to_sse([*with_null, usage]))
    assert client.writes == [chunks_to_sse(content)]
    assert tee.exchange.chunks == 0  # not read yet
    await tee.end(whole=True)
    tee.finish()
    exchange = tee.exchange
    assert (exchange.chunks, exchange.usage, exchange.outcome) == (4, {"total_tokens": 3}, "ok")
    assert exchange.response_bytes == len(client.received) == len(chunks_to_sse(content))
    assert exchange.response_json["choices"][0]["message"]["content"] == "Hi"


@pytest.mark.parametrize(
    ("piece", "ahead"),
    [
        (b'data: {"a":1}\n\ndata: {"choices":[],"usage":{"t":1}}\n\n', 53),
        (b'data: {"a":1}\r\n\r\ndata: {"usage": {"t":1}}\r\n\r\n', 45),
        (b'data: {"a":1}\n\ndata: {"a":', 15),  # the last event is still coming
        (b'data: {"a":1,"usage":null}\n\n', 28),
        (b'data: {"a":1}', 0),
        (b"data: a\r\rdata: b\n", 0),  # no blank line after a line feed: read first
        (b"data: a\n\ndata: b\r\n\r\ndata: c", 20),  # line ends mixed: the last blank line
        (b"data: a\r\n\r\ndata: b\n\ndata: c", 20),
    ],
)
def test_the_whole_events_of_a_piece(piece: bytes, ahead: int) -> None:
    assert whole_events(piece) == ahead


@pytest.mark.parametrize(
    ("events", "out"),
    [
        (
            b'data: {"a":1}\n\ndata: {"choices":[],"usage":{"t":1}}\n\ndata: [DONE]\n\n',
            b'data: {"a":1}\n\ndata: [DONE]\n\n',
        ),
        # usage with choices (some servers report it on the last content chunk): it stays
        (
            b'data: {"choices":[{"index":0}],"usage":{"t":1}}\n\n',
            b'data: {"choices":[{"index":0}],"usage":{"t":1}}\n\n',
        ),
        # spelled with spaces, CRLF lines, an event name and a comment inside the event
        (
            b': hi\r\nevent: x\r\ndata: {"choices": [],\r\n'
            b': c\r\ndata: "usage" : {"t": 1}}\r\n\r\n',
            b": hi\r\n",
        ),
        (
            b'data: {"choices":[],"usage":{"t":1},}\n\n',
            b'data: {"choices":[],"usage":{"t":1},}\n\n',
        ),
        (b'data: {"choices":[],"usage":null,"x":1}\n\n', b'data: {"choices":[],"x":1}\n\n'),
        (b'data: "usage": 1\n\n', b'data: "usage": 1\n\n'),  # JSON, not an object
        (b'data:{"choices":[],"usage":{"t":1}}\n\n', b""),  # no space after the colon
        # a comment among the usage event's lines is not part of the event: it stays
        (b': ping\ndata: {"choices":[],"usage":{"t":1}}\n\n', b": ping\n"),
        # a CR ends a line too: one event of two data lines, then two events
        (b'data: {\rdata: "choices":[],"usage":{"t":1}}\n\n', b""),
        (
            b'data: {"a":1,"usage":null}\n\rdata: {"choices":[],"usage":{"t":1}}\n\n',
            b'data: {"a":1}\n\r',
        ),
        # two usage events between the same two LF blank lines (CR ends their lines)
        (
            b'data: {"choices":[],"usage":{"t":1}}\r\r'
            b': c\rdata: {"choices":[],"usage":{"t":2}}\n\n',
            b": c\r",
        ),
        # usage in every chunk (vLLM's continuous usage): only the usage-only event goes
        (
            b'data: {"choices":[{"index":0}],"usage":{"t":1}}\n\n'
            b'data: {"choices":[],"usage":{"t":2}}\n\n'
            b'data: {"choices":[{"index":0}],"usage":{"t":3}}\n\n',
            b'data: {"choices":[{"index":0}],"usage":{"t":1}}\n\n'
            b'data: {"choices":[{"index":0}],"usage":{"t":3}}\n\n',
        ),
        # the null spelled otherwise, before the usage event and after it
        (
            b'data: {"usage": null, "a":1}\n\ndata: {"choices":[],"usage":{"t":1}}\n\n'
            b'data: {"usage":null,"b":2}\n\n',
            b'data: {"a":1}\n\ndata: {"b":2}\n\n',
        ),
        # the key spelled with escapes, alone and before a usage key spelled plainly
        (b'data: {"choices":[],"\\u0075sage":{"t":1}}\n\n', b""),
        (
            b'data: {"choices":[],"us\\u0061ge":{"t":1}}\n\ndata: {"a":1, "usage": null}\n\n',
            b'data: {"a":1}\n\n',
        ),
        (b'data: {"c":"caf\\u00e9"}\n\n', b'data: {"c":"caf\\u00e9"}\n\n'),
        # the JSON going on in a later data line between the key and its colon
        (b'data: {"choices":[],"usage"\r\ndata: :{"t":1}}\r\n\r\n', b""),
        (b'data: {"choices":[],"usage"\nevent: m\n: c\ndata: :{"t":1}}\n\n', b""),
        (b'data: {"choices":[],"usage" \nevent: null\ndata: :{"t":1}}\n\n', b""),
    ],
)
def test_usage_events_cut_from_whole_events(events: bytes, out: bytes) -> None:
    assert without_usage_events(events) == out


@pytest.mark.parametrize(
    ("events", "out"),
    [
        (b'data: {"a":1,"usage":null}\n\n', b'data: {"a":1}\n\n'),
        (b'data: {"a":1,\t"usage" : null}\n\n', b'data: {"a":1}\n\n'),
        (b'data: {"usage": null, "a":1}\r\n\r\n', b'data: {"a":1}\r\n\r\n'),
        (b'data: {"a":1,"\\u0075sage":null}\n\n', b'data: {"a":1}\n\n'),
        # JSON split over data lines keeps its lines: a member is never cut across a line end
        (b'data: {"usage":null,\ndata: "a":1}\n\n', b'data: {\ndata: "a":1}\n\n'),
        (b'data: {"usage":null,\r\ndata: "a":1}\r\n\r\n', b'data: {\r\ndata: "a":1}\r\n\r\n'),
    ],
)
def test_null_usage_members_cut(events: bytes, out: bytes) -> None:
    assert without_null_usage(events) == out


async def test_a_piece_that_may_start_with_a_byte_order_mark_is_read_first() -> None:
    """Only the stream's parser knows whether those bytes are a byte order mark (at the
    stream's start) or part of a field name."""
    client = Writes()
    tee = _chat_tee(Deferred(delay=60), withhold=True, client=client)
    usage = {**_chunk(None), "choices": [], "usage": {"total_tokens": 3}}
    piece = b"\xef\xbb\xbf" + chunks_to_sse([usage, {**_chunk("Hi"), "usage": None}])
    assert not tee.passes(piece)
    await tee.relay(piece)
    assert tee.exchange.chunks == 3  # read before anything went out
    assert client.received == b"\xef\xbb\xbf" + chunks_to_sse([_chunk("Hi")])


async def test_a_bug_reading_a_waiting_piece_is_recorded_not_raised(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(self: object, chunk: object) -> bool:
        raise RuntimeError("assembler bug")

    monkeypatch.setattr(ChatAssembler, "add", broken)
    later = Deferred(delay=0.01)
    tee = _chat_tee(later, withhold=False)
    await tee.relay(chunks_to_sse([_chunk("Hi")]))
    later.flush()
    await tee.end(whole=True)
    tee.finish()
    assert tee.exchange.outcome == "proxy_error"
    assert tee.exchange.error == "reading the body failed: RuntimeError: assembler bug"
    assert "reading the body failed" in caplog.text


async def test_an_event_the_end_of_the_body_completes_is_timed_when_the_body_ended() -> None:
    before = time.perf_counter()
    tee = _chat_tee(Deferred(delay=60), withhold=False)
    await tee.relay(chunks_to_sse([_chunk("Hi")], done=False).rstrip(b"\n") + b"\n")
    await tee.end(whole=True)
    ended = time.perf_counter()
    await asyncio.sleep(0.05)  # the record is completed a while after the body ended
    tee.finish()
    ttft = tee.exchange.ttft_ms
    assert tee.exchange.chunks == 1 and ttft is not None and ttft <= (ended - before) * 1000


@pytest.mark.parametrize("whole", [True, False], ids=["body-ended", "body-abandoned"])
async def test_a_client_that_left_after_the_whole_body_had_its_answer(whole: bool) -> None:
    """A body without a final event (a non-stream, a stream of unknown events) was answered
    whole when the upstream's body ended and every piece of it went to the client: the
    client leaving then (`write_eof` finds the socket reset) loses nothing."""
    tee = _tee("/files", sse=False)
    await tee.relay(b'{"id": "file-1"}')
    await tee.end(whole=whole)
    tee.exchange.outcome = "client_disconnected"
    tee.finish()
    assert tee.exchange.outcome == ("ok" if whole else "client_disconnected")


def _usage_first(chunk: dict[str, Any]) -> bytes:
    if "usage" in chunk:
        chunk = {"usage": chunk["usage"], **chunk}
    return json.dumps(chunk).encode()


SPELLINGS: dict[str, Callable[[dict[str, Any]], bytes]] = {
    "openai": orjson.dumps,  # {...,"choices":[...],"usage":null}
    "spaced": lambda chunk: json.dumps(chunk).encode(),  # {..., "usage": null}
    "usage-first": _usage_first,  # {"usage": null, ...}
}


def _pieces(max_piece: int | None) -> str:
    return {None: "pieces-event", 0: "pieces-one"}.get(max_piece, f"pieces-{max_piece}")


def _answer_by_option(
    upstream: FakeUpstream, spell: Any, max_piece: int | None, continuous: bool = False
) -> Any:
    """An upstream that streams as OpenAI does: asked for usage, it adds a usage event and a
    `"usage": null` to every other chunk (or, `continuous`, as vLLM's continuous usage
    stats do, a usage object to every chunk); its pieces cut at random places, one event each
    (`max_piece` None) or all in one (0)."""

    async def answer(request: web.Request) -> web.StreamResponse:
        options = (await request.json()).get("stream_options") or {}
        asked = options.get("include_usage") is True
        chunks = completion_to_chunks(
            upstream.completion, include_usage=asked, rng=random.Random(3)
        )
        if continuous and asked:
            for chunk in chunks[:-1]:
                chunk["usage"] = {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}
        body = b"".join(b"data: " + spell(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        if max_piece is None:
            pieces = [e + b"\n\n" for e in body.split(b"\n\n")[:-1]]
        elif max_piece == 0:  # all at once, as a short stream often comes
            pieces = [body]
        else:
            pieces = cut_bytes(body, random.Random(max_piece), max_piece=max_piece)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in pieces:
            await response.write(piece)
            await asyncio.sleep(0)
        await response.write_eof()
        upstream.sent = bytearray(body)
        return response

    return answer


@pytest.mark.parametrize("max_piece", [1, 9, 40, 300, None, 0], ids=_pieces)
@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
async def test_a_client_that_did_not_ask_for_usage_gets_the_bytes_it_gets_direct(
    upstream: FakeUpstream, proxy: RunningProxy, spelling: str, max_piece: int | None
) -> None:
    """The proxy's usage option changes every chunk the upstream sends (`"usage":null`); the
    client gets them as they come without the option, byte for byte, however they are cut."""
    upstream.completion["choices"][0]["message"]["content"] = UTF8_HEAVY
    upstream.override = _answer_by_option(upstream, SPELLINGS[spelling], max_piece)
    _, _, direct = await _post_raw(upstream.url, _request(True, include_usage=False))
    assert b'"usage"' not in direct
    _, _, received = await _post_raw(proxy.base_url, _request(True, include_usage=False))
    assert upstream.sent.count(b"null") > direct.count(b"null")  # the upstream added them
    assert received == direct
    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.usage == upstream.completion["usage"] and exchange.usage_source == "injected"
    assert exchange.response_bytes == len(received)
    assert gzip.decompress(exchange.raw_stream_gz or b"") == received


@pytest.mark.parametrize("max_piece", [7, None, 0], ids=_pieces)
async def test_content_chunks_that_carry_usage_reach_the_client(
    upstream: FakeUpstream, proxy: RunningProxy, max_piece: int | None
) -> None:
    """vLLM's continuous usage stats put a usage object in every content chunk: only the
    usage-only event the proxy asked for is withheld, never a chunk with content."""
    upstream.completion["choices"][0]["message"]["content"] = UTF8_HEAVY
    upstream.override = _answer_by_option(upstream, orjson.dumps, max_piece, continuous=True)
    _, _, received = await _post_raw(proxy.base_url, _request(True, include_usage=False))
    assert received == _less_usage_event(bytes(upstream.sent))
    events = [orjson.loads(e[6:]) for e in received.split(b"\n\n")[:-2]]
    assert all(e["usage"] is not None for e in events)
    text = "".join(c["delta"].get("content") or "" for e in events for c in e["choices"])
    assert text == UTF8_HEAVY


async def test_while_it_injects_the_proxy_asks_for_an_uncompressed_stream(
    upstream: FakeUpstream, proxy: RunningProxy
) -> None:
    """Bytes cannot be cut out of a compressed stream: the proxy asks for none when it must
    withhold the usage event, whatever the client accepts."""

    async def answer(request: web.Request) -> web.StreamResponse:
        options = (await request.json()).get("stream_options") or {}
        chunks = completion_to_chunks(
            upstream.completion, include_usage=bool(options), rng=random.Random(5)
        )
        body = chunks_to_sse(chunks)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body)
            response.headers["Content-Encoding"] = "gzip"
        await response.prepare(request)
        await response.write(body)
        return response

    upstream.override = answer
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            proxy.base_url + "/chat/completions",
            json=_request(True),
            headers={"Accept-Encoding": "gzip, deflate"},
        ) as response,
    ):
        received = await response.read()
    assert upstream.seen[-1].headers["Accept-Encoding"] == "identity"
    assert b'"usage"' not in received
    assert received == chunks_to_sse(
        completion_to_chunks(upstream.completion, include_usage=False, rng=random.Random(5))
    )


async def _stream_in_pieces(request: web.Request, body: bytes) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for start in range(0, len(body), 1 << 16):
        await response.write(body[start : start + (1 << 16)])
    await response.write_eof()
    return response


async def test_a_stream_past_max_stream_record_bytes_is_relayed_whole_and_recorded_bounded(
    upstream: FakeUpstream, make_proxy: Any
) -> None:
    """A 24 MB stream through a proxy that records 256 KiB of a stream: the client gets every
    byte it gets direct; the record keeps the start of the answer, its usage and its end,
    counts every byte and says it was truncated."""
    bound = 256 * 1024
    usage = {"prompt_tokens": 5, "completion_tokens": 180_000, "total_tokens": 180_005}
    head = b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'

    async def answer(request: web.Request) -> web.StreamResponse:
        asked = "stream_options" in await request.json()
        null = b',"usage":null' if asked else b""
        event = head + b'[{"index":0,"delta":{"content":"%06d word "}}]' + null + b"}\n\n"
        body = b"".join(event % i for i in range(180_000))
        if asked:
            body += head + b'[],"usage":' + orjson.dumps(usage) + b"}\n\n"
        return await _stream_in_pieces(request, body + b"data: [DONE]\n\n")

    upstream.override = answer
    proxy = await make_proxy(max_stream_record_bytes=bound)
    _, _, direct = await _post_raw(upstream.url, _request(True))
    _, _, received = await _post_raw(proxy.base_url, _request(True))
    assert len(received) > 20_000_000 and received == direct
    [exchange] = await proxy.recorder.wait_for(1, within=30)
    assert (exchange.outcome, exchange.usage) == ("ok", usage)
    assert exchange.response_bytes == len(received)
    assert exchange.chunks == 180_002
    content = exchange.response_json["choices"][0]["message"]["content"]
    assert content.startswith("000000 word 000001 word ") and len(content) < bound
    assert len(gzip.decompress(exchange.raw_stream_gz or b"")) <= bound + (1 << 16)
    assert len(exchange.raw_pacing or []) < 10
    [note] = exchange.parse_errors
    assert "truncated" in note and "max_stream_record_bytes" in note


async def test_a_responses_stream_past_the_bound_keeps_its_usage_not_its_whole_output(
    upstream: FakeUpstream, make_proxy: Any
) -> None:
    """A Responses stream's final event repeats the whole output: past the bound the record
    takes its usage and status from it, not the output."""
    bound = 64 * 1024
    text = "".join(f"{i:06d} word " for i in range(30_000))
    usage = {"input_tokens": 3, "output_tokens": 30_000, "total_tokens": 30_003}
    final: dict[str, Any]
    final = {"id": "resp_1", "object": "response", "status": "completed", "model": "m"}
    final |= {"usage": usage, "output": [{"type": "message", "content": [{"text": text}]}]}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": {**final, "usage": None, "output": []}}
    ]
    events += [
        {"type": "response.output_text.delta", "output_index": 0, "delta": text[i : i + 12]}
        for i in range(0, len(text), 12)
    ]
    events.append({"type": "response.completed", "response": final})
    body = b"".join(
        b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events
    )

    async def answer(request: web.Request) -> web.StreamResponse:
        return await _stream_in_pieces(request, body)

    upstream.override = answer
    proxy = await make_proxy(max_stream_record_bytes=bound)
    async with (
        aiohttp.ClientSession() as session,
        session.post(proxy.base_url + "/responses", json={"model": "m", "stream": True}) as r,
    ):
        received = await r.read()
    assert received == body
    [exchange] = await proxy.recorder.wait_for(1, within=30)
    assert (exchange.outcome, exchange.usage) == ("ok", usage)
    assert exchange.response_json["status"] == "completed"
    assert len(orjson.dumps(exchange.response_json)) < bound
    assert any("truncated" in note for note in exchange.parse_errors)


async def test_a_stream_of_unknown_events_past_the_bound_keeps_only_the_events_before_it() -> None:
    client = Client()
    tee = _tee("/threads/runs", sse=True, max_stream_record_bytes=300, client=client)
    events: list[dict[str, Any]] = [
        {"object": "thread.run.step.delta", "n": n, "text": "x" * 60} for n in range(10)
    ]
    usage = {"total_tokens": 3}
    events.append({"object": "thread.run", "usage": usage})  # past the bound: read, not kept
    body = b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in events)
    for event in body.split(b"\n\n")[:-1]:
        await tee.relay(event + b"\n\n")
    await tee.end(whole=True)
    tee.finish()
    assert bytes(client.received) == body
    kept = tee.exchange.response_json
    assert 0 < len(kept) < len(events) - 1 and kept == events[: len(kept)]
    assert tee.exchange.usage == usage
    assert "larger than max_stream_record_bytes" in tee.exchange.parse_errors[-1]
