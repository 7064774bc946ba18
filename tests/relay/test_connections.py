"""Client connections over real sockets: a slowloris and idle connections are closed after
`client_header_timeout` / `keepalive_timeout`, while a normal keep-alive client, a slow body
and a long stream are not; malformed requests get a 400 or 431 and one info line."""

from __future__ import annotations

import asyncio
import logging
import time
from urllib.parse import urlsplit

import orjson
import pytest

from tests.conftest import FakeUpstream, ProxyFactory, Sdk

SLACK = 5.0
"""Seconds a close may come after its timeout on a busy machine."""

GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


async def _connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return await asyncio.open_connection(parts.hostname, parts.port)


async def _closed_after(reader: asyncio.StreamReader, started: float, within: float) -> float:
    """Seconds from `started` until the server closed the connection (reading only EOF)."""
    try:
        rest = await asyncio.wait_for(reader.read(), within)
    except ConnectionResetError:
        rest = b""
    assert rest == b"", rest
    return time.monotonic() - started


async def _response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    status = int(head.split(b" ", 2)[1])
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return status, await asyncio.wait_for(reader.readexactly(length), 10)


async def test_a_slowloris_is_closed_after_the_header_timeout(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(client_header_timeout=1.0)
    reader, writer = await _connect(proxy.url)
    started = time.monotonic()
    closed = asyncio.create_task(_closed_after(reader, started, 1.0 + SLACK))
    dribble = b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 1000
    for byte in dribble:  # a byte every 0.1 s, far longer than the timeout
        if closed.done():
            break
        writer.write(bytes([byte]))
        await asyncio.sleep(0.1)
    assert 0.9 <= await closed <= 1.0 + SLACK
    writer.close()


async def test_idle_connections_are_closed(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(client_header_timeout=1.0, keepalive_timeout=1.5)
    started = time.monotonic()
    never_sent = [await _connect(proxy.url) for _ in range(100)]
    kept_alive = [await _connect(proxy.url) for _ in range(20)]
    for reader, writer in kept_alive:
        writer.write(GET)
        assert (await _response(reader))[0] == 200
    waits = [_closed_after(r, started, 1.0 + SLACK) for r, _ in never_sent]
    waits += [_closed_after(r, started, 1.5 + SLACK) for r, _ in kept_alive]
    assert all(seconds >= 0.9 for seconds in await asyncio.gather(*waits))
    for _, writer in never_sent + kept_alive:
        writer.close()


async def test_a_kept_alive_client_may_wait_longer_than_the_header_timeout(
    make_proxy: ProxyFactory,
) -> None:
    # The header clock starts with the next request's first byte, not with the last answer.
    proxy = await make_proxy(client_header_timeout=0.5, keepalive_timeout=30.0)
    reader, writer = await _connect(proxy.url)
    for _ in range(3):
        writer.write(GET)
        assert await _response(reader) == (200, b'{"status": "ok"}')
        await asyncio.sleep(1.0)
    writer.close()


async def test_a_slowloris_on_a_kept_alive_connection_is_closed(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(client_header_timeout=1.0, keepalive_timeout=30.0)
    reader, writer = await _connect(proxy.url)
    writer.write(GET)
    assert (await _response(reader))[0] == 200
    writer.write(b"GET /healthz HTTP/1.1\r\n")
    started = time.monotonic()
    assert 0.9 <= await _closed_after(reader, started, 1.0 + SLACK) <= 1.0 + SLACK
    writer.close()


async def test_a_slow_body_is_not_cut_by_the_header_timeout(
    make_proxy: ProxyFactory, upstream: FakeUpstream
) -> None:
    proxy = await make_proxy(client_header_timeout=0.5)
    body = orjson.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
    reader, writer = await _connect(proxy.url)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    for start in range(0, len(body), len(body) // 4 + 1):  # over about 1.5 s
        await asyncio.sleep(0.4)
        writer.write(body[start : start + len(body) // 4 + 1])
    status, answer = await _response(reader)
    assert status == 200
    assert orjson.loads(answer) == upstream.completion
    assert upstream.seen[-1].body == body
    writer.close()


async def test_a_long_stream_and_the_next_request_are_not_cut(
    make_proxy: ProxyFactory, upstream: FakeUpstream, sdk: Sdk
) -> None:
    upstream.by_event, upstream.pause = True, 0.3  # a stream of several times the timeouts
    proxy = await make_proxy(client_header_timeout=0.5, keepalive_timeout=0.5)
    client = sdk(proxy.base_url, "sk-test", max_retries=0)
    for _ in range(2):
        started = time.monotonic()
        stream = await client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == upstream.completion["choices"][0]["message"]["content"]
        assert time.monotonic() - started > 1.0
        await asyncio.sleep(0.2)  # well inside keepalive_timeout: the pool reuses the connection


MALFORMED = {
    "a 100 KB header": (
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n",
        431,
    ),
    "two Content-Length values": (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
        b"Content-Length: 4\r\n\r\nabcd",
        400,
    ),
    "a bad request line": (b"GET\r\n\r\n", 400),
    "too many headers": (
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
        + b"".join(b"X-%d: y\r\n" % i for i in range(200))
        + b"\r\n",
        431,
    ),
    "a header name with a space": (
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization : Bearer sk-secret-123\r\n\r\n",
        400,
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_a_malformed_request_gets_an_answer_and_one_line(
    make_proxy: ProxyFactory, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    data, expected = MALFORMED[case]
    proxy = await make_proxy()
    caplog.set_level(logging.DEBUG)
    caplog.clear()
    reader, writer = await _connect(proxy.url)
    writer.write(data)
    status, body = await _response(reader)
    assert status == expected
    error = orjson.loads(body)["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("flightrec: malformed request: ")
    await _closed_after(reader, time.monotonic(), SLACK)
    writer.close()
    logged = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(logged) == 1, [r.getMessage() for r in logged]
    assert logged[0].levelno == logging.INFO and logged[0].exc_info is None
    assert "\n" not in logged[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)
    assert b"sk-secret" not in body and "sk-secret" not in caplog.text
