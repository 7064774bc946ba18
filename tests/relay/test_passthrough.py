"""Everything that is not a chat completion passes through unchanged, and failures are OpenAI-
shaped: routing, headers, other endpoints, upstream errors, compression, limits, health."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web
from yarl import URL

from proxy.config import Config, Upstream
from proxy.relay.app import build_app, make_runner
from proxy.store import upgrade
from proxy.store.recorder import DatabaseRecorder
from tests.conftest import FakeUpstream, RunningProxy, Sdk, reserved_port

KEY = "sk-live-SECRET-abcdef123456"
STREAM_REQUEST = {"model": "gpt-4o-mini", "stream": True, "messages": []}


async def _get(url: str | URL, **kwargs: Any) -> tuple[int, Any, bytes]:
    method = kwargs.pop("method", "GET")
    async with (
        aiohttp.ClientSession(auto_decompress=False) as session,
        session.request(method, url, **kwargs) as response,
    ):
        return response.status, response.headers.copy(), await response.read()


async def test_models_and_embeddings_pass_through(
    upstream: FakeUpstream, proxy: RunningProxy, sdk: Sdk
) -> None:
    client = sdk(proxy.base_url, KEY)
    direct = sdk(upstream.url, KEY)
    assert (await client.models.list()).model_dump() == (await direct.models.list()).model_dump()
    embedding = await client.embeddings.create(model="text-embedding-3-small", input="hi")
    assert embedding.data[0].embedding == [0.25, -0.5]
    exchanges = await proxy.recorder.wait_for(2)
    models, embed = exchanges
    assert (models.method, models.path, models.status) == ("GET", "/v1/models", 200)
    assert models.usage_source is None
    assert embed.usage == {"prompt_tokens": 5, "total_tokens": 5}
    assert embed.usage_source == "reported" and embed.model == "text-embedding-3-small"


async def test_headers_query_and_control_headers(
    upstream: FakeUpstream, proxy: RunningProxy
) -> None:
    status, headers, _ = await _get(
        proxy.base_url + "/models?limit=2&after=a%20b",
        headers={
            "Authorization": f"Bearer {KEY}",
            "X-Flightrec-Tag-Team": "search",
            "X-Flightrec-Tag-Env": "prod",
            "X-Flightrec-User": "alice",
            "X-Flightrec-Session": "s-1",  # named in `Connection` too: read all the same
            "OpenAI-Organization": "org-1",
            "Connection": "keep-alive, X-Hop, X-Flightrec-Session",
            "X-Hop": "dropped",
        },
    )
    assert status == 200
    seen = upstream.seen[-1]
    assert seen.path_qs == "/v1/models?limit=2&after=a%20b"
    lowered = {k.lower(): v for k, v in seen.headers.items()}
    assert lowered["authorization"] == f"Bearer {KEY}"
    assert lowered["openai-organization"] == "org-1"
    assert not any(k.startswith("x-flightrec-") for k in lowered)
    assert "x-hop" not in lowered
    [exchange] = await proxy.recorder.wait_for(1)
    assert headers["X-Flightrec-Id"] == exchange.id
    assert headers["x-request-id"] == "req_fake123"
    assert exchange.tags == {"team": "search", "env": "prod"}
    assert exchange.user == "alice" and exchange.session == "s-1"
    assert exchange.key_hint == "sk-...3456" and len(exchange.key_hash or "") == 16
    assert KEY not in repr(exchange)


async def test_user_falls_back_to_body_and_omit_drops_bodies(
    upstream: FakeUpstream, proxy: RunningProxy, sdk: Sdk
) -> None:
    client = sdk(proxy.base_url, KEY)
    await client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "x"}], user="bob"
    )
    await client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "private"}],
        extra_headers={"X-Flightrec-Omit": "all"},
    )
    first, second = await proxy.recorder.wait_for(2)
    assert first.user == "bob"
    assert second.request_body is None and second.request_json is None
    assert second.response_body is None and second.response_json is None
    assert second.usage == upstream.completion["usage"] and second.model == "gpt-4o"


async def test_upstream_error_passes_through_with_headers_and_body(
    upstream: FakeUpstream, proxy: RunningProxy, sdk: Sdk
) -> None:
    body = orjson.dumps(
        {
            "error": {
                "message": "Rate limit reached",
                "type": "requests",
                "param": None,
                "code": "rate_limit_exceeded",
            }
        }
    )

    async def limited(request: web.Request) -> web.StreamResponse:
        return web.Response(
            status=429,
            body=body,
            content_type="application/json",
            headers={"retry-after": "7", "x-ratelimit-remaining-requests": "0"},
        )

    upstream.override = limited
    status, headers, received = await _get(
        proxy.base_url + "/chat/completions", method="POST", json={"model": "m"}
    )
    assert (status, received) == (429, body)
    assert headers["retry-after"] == "7" and headers["x-ratelimit-remaining-requests"] == "0"
    client = sdk(proxy.base_url, KEY, max_retries=0)
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(model="m", messages=[])
    exchange = (await proxy.recorder.wait_for(2))[0]
    assert exchange.outcome == "upstream_error" and exchange.error == "Rate limit reached"
    assert exchange.status == 429 and exchange.usage_source is None


async def test_answers_without_a_body_and_slow_bodies_keep_their_headers(
    upstream: FakeUpstream, proxy: RunningProxy
) -> None:
    # Headers of a non-stream answer leave with its first body piece, or at its end when it
    # has none.
    async def answer(request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/slow"):
            response = web.StreamResponse(headers={"x-request-id": "req_slow"})
            response.content_type = "application/octet-stream"
            await response.prepare(request)
            for piece in (b"one ", b"two"):
                await asyncio.sleep(0.05)
                await response.write(piece)
            await response.write_eof()
            return response
        return web.Response(status=204, headers={"x-request-id": "req_204"})

    upstream.override = answer
    for method in ("DELETE", "HEAD"):
        status, headers, received = await _get(proxy.base_url + "/files/f1", method=method)
        assert (status, received, headers["x-request-id"]) == (204, b"", "req_204")
    status, headers, received = await _get(proxy.base_url + "/files/slow")
    assert (status, received, headers["x-request-id"]) == (200, b"one two", "req_slow")
    recorded = await proxy.recorder.wait_for(3)
    assert [ex.status for ex in recorded] == [204, 204, 200]
    assert all(ex.outcome == "ok" for ex in recorded)


class _HeldHeaders(web.StreamResponse):
    """An upstream response whose headers leave with its first write (as flightrec's do)."""

    _send_headers_immediately = False


@pytest.mark.parametrize("with_headers", [b"", b'data: {"choices":[{"index":0,"delta":{"con'])
async def test_stream_headers_do_not_wait_for_a_late_first_event(
    upstream: FakeUpstream, proxy: RunningProxy, with_headers: bytes
) -> None:
    # The proxy lets a stream's headers wait for its first event only when that event came
    # with them. Here nothing did, or only half an event (which the proxy holds back while it
    # withholds the usage event it asked for): the headers must still go out at once.
    rest = b'tent":"hi"}}],"usage":null}\n\n' if with_headers else b""
    rest += b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,'
    rest += b'"total_tokens":2}}\n\ndata: [DONE]\n\n'
    order: list[str] = []
    headers_in = asyncio.Event()

    async def answer(request: web.Request) -> web.StreamResponse:
        kind = _HeldHeaders if with_headers else web.StreamResponse
        response = kind(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if with_headers:
            await response.write(with_headers)
        # The rest comes once the client has the headers; 10 s when they wait for it.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(headers_in.wait(), 10)
        order.append("rest of the stream")
        await response.write(rest)
        await response.write_eof()
        return response

    upstream.override = answer
    async with (
        aiohttp.ClientSession() as session,
        session.post(proxy.base_url + "/chat/completions", json=STREAM_REQUEST) as response,
    ):
        order.append("headers")
        headers_in.set()
        body = await response.read()
    assert response.status == 200 and order == ["headers", "rest of the stream"]
    assert body.endswith(b"data: [DONE]\n\n") and b'"total_tokens":2' not in body
    (recorded,) = await proxy.recorder.wait_for(1)
    assert recorded.usage == {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}


async def _read_cut_stream(base_url: str) -> bytes:
    """What a client reads of a stream whose body is cut (the cut itself raises)."""
    received = b""
    async with (
        aiohttp.ClientSession() as session,
        session.post(base_url + "/chat/completions", json=STREAM_REQUEST) as response,
    ):
        with pytest.raises(aiohttp.ClientPayloadError):
            async for piece in response.content.iter_any():
                received += piece
    return received


async def test_a_stream_the_upstream_cuts_is_cut_for_the_client_too(
    upstream: FakeUpstream, proxy: RunningProxy, caplog: pytest.LogCaptureFixture
) -> None:
    first = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}],"usage":null}\n\n'

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(first)
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.close()  # gone mid-body: no last chunk
        await asyncio.sleep(0.1)
        return response

    upstream.override = answer
    received = await _read_cut_stream(proxy.base_url)
    # What came before the cut (as it comes without the usage the proxy asked for), then the
    # cut itself.
    assert received == first.replace(b',"usage":null', b"")
    (recorded,) = await proxy.recorder.wait_for(1)
    assert (recorded.outcome, "body broken" in (recorded.error or "")) == (
        "upstream_disconnected",
        True,
    ), recorded.error
    # Only the proxy's and its server's own: the asyncio logger also carries errors of other
    # tests' leftovers (a client the garbage collector closes on this test's loop).
    ours = ("proxy", "flightrec", "aiohttp")
    errors = [r for r in caplog.records if r.levelname == "ERROR" and r.name.startswith(ours)]
    assert not [r.getMessage() for r in errors]


def _assert_openai_error(body: bytes, type_: str | None = None) -> dict[str, Any]:
    error = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if type_:
        assert error["type"] == type_
    return dict(error)


async def test_unknown_path_is_404_in_openai_shape(proxy: RunningProxy) -> None:
    status, _, body = await _get(proxy.url + "/other/thing")
    assert status == 404
    assert "/other/thing" in _assert_openai_error(body, "invalid_request_error")["message"]
    status, _, _ = await _get(proxy.url + "/v10/models")  # a prefix is a path segment
    assert status == 404


async def test_dead_upstream_is_502_and_recorded(make_proxy: Any) -> None:
    with reserved_port() as port:  # nothing listens there
        dead = f"http://127.0.0.1:{port}/v1"
        proxy = await make_proxy(upstreams=(Upstream("deadone", dead, "/v1"),))
        status, headers, body = await _get(proxy.base_url + "/models")
    assert status == 502
    assert "deadone" in _assert_openai_error(body)["message"]
    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.outcome == "upstream_error" and headers["X-Flightrec-Id"] == exchange.id
    assert "deadone" in (exchange.error or "")


async def test_silent_upstream_is_504_and_recorded(upstream: FakeUpstream, make_proxy: Any) -> None:
    async def silent(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(5)
        return web.Response(text="late")

    upstream.override = silent
    proxy = await make_proxy(read_timeout=0.3)
    status, _, body = await _get(proxy.base_url + "/models")
    assert status == 504
    assert "openai" in _assert_openai_error(body, "upstream_timeout")["message"]
    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.outcome == "timeout" and exchange.status == 504


async def test_request_over_the_limit_is_413(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = await make_proxy(max_request_bytes=1000)
    status, _, body = await _get(
        proxy.base_url + "/chat/completions",
        method="POST",
        data=b"{" + b" " * 2000 + b"}",
        headers={"X-Flightrec-Tag-Team": "search", "X-Flightrec-User": "alice"},
    )
    assert status == 413
    _assert_openai_error(body, "invalid_request_error")
    assert upstream.seen == []
    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.status == 413 and exchange.outcome == "proxy_error"
    # Refused before its headers for the upstream were made: its control headers still count.
    assert exchange.tags == {"team": "search"} and exchange.user == "alice"


@pytest.mark.parametrize("piece_size", [None, 100])
async def test_a_body_over_max_record_bytes_is_relayed_whole_and_not_kept(
    upstream: FakeUpstream, make_proxy: Any, piece_size: int | None
) -> None:
    upstream.completion["choices"][0]["message"]["content"] = "x" * 3000
    upstream.piece_size = piece_size
    proxy = await make_proxy(max_record_bytes=2000)
    status, _, received = await _get(
        proxy.base_url + "/chat/completions", method="POST", json={"model": "m"}
    )
    assert status == 200 and received == bytes(upstream.sent) and len(received) > 3000
    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.outcome == "ok" and exchange.response_bytes == len(received)
    assert exchange.response_body is None and exchange.response_json is None
    assert exchange.parse_errors == ["response body larger than max_record_bytes: not recorded"]


@pytest.mark.parametrize("stream", [False, True])
async def test_compressed_upstream_is_relayed_raw_and_recorded_decoded(
    upstream: FakeUpstream, proxy: RunningProxy, stream: bool, sdk: Sdk
) -> None:
    upstream.compress = True
    body: dict[str, Any] = {"model": "m", "messages": [], "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}  # nothing to cut: relayed as is
    status, headers, received = await _get(
        proxy.base_url + "/chat/completions",
        method="POST",
        json=body,
        headers={"Accept-Encoding": "gzip, br, zstd"},
    )
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert received == bytes(upstream.sent)
    assert upstream.seen[-1].headers["Accept-Encoding"] == "gzip"  # only what we can decode
    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.response_json == upstream.completion
    if not stream:
        assert exchange.response_body == gzip.decompress(received)
    client = sdk(proxy.base_url, KEY)
    answer = await client.chat.completions.create(model="m", messages=[])
    assert (
        answer.choices[0].message.content == upstream.completion["choices"][0]["message"]["content"]
    )


async def test_several_upstreams_by_prefix(upstream: FakeUpstream, make_proxy: Any) -> None:
    proxy = await make_proxy(
        upstreams=(
            Upstream("openai", upstream.url, "/v1"),
            Upstream("local", upstream.url, "/local/v1"),
        )
    )
    await _get(proxy.url + "/local/v1/models")
    assert upstream.seen[-1].path_qs == "/v1/models"
    [exchange] = await proxy.recorder.wait_for(1)
    assert exchange.upstream == "local"


@pytest.mark.parametrize("beta_first", [True, False])
async def test_the_longest_matching_prefix_wins(
    upstream: FakeUpstream, make_proxy: Any, beta_first: bool
) -> None:
    root = upstream.url.removesuffix("/v1")
    upstreams = [Upstream("openai", upstream.url, "/v1"), Upstream("beta", root + "/b", "/v1/beta")]
    proxy = await make_proxy(upstreams=tuple(reversed(upstreams) if beta_first else upstreams))
    for path in ("/v1/beta/models", "/v1/models", "/v1/betamax"):
        await _get(proxy.url + path)
    assert [seen.path_qs for seen in upstream.seen] == ["/b/models", "/v1/models", "/v1/betamax"]
    recorded = await proxy.recorder.wait_for(3)
    assert [ex.upstream for ex in recorded] == ["beta", "openai", "openai"]


async def test_health_endpoints(proxy: RunningProxy) -> None:
    assert (await _get(proxy.url + "/healthz"))[0] == 200
    status, _, body = await _get(proxy.url + "/readyz")
    assert status == 200 and orjson.loads(body)["status"] == "ready"


@pytest.mark.parametrize(
    "path",
    [
        "/v1/../admin.txt",
        "/v1/%2e%2e/admin.txt",
        "/v1/%2E%2e/admin.txt",
        "/v1/.%2E/admin.txt",
        "/v1/chat/../../admin.txt",
        "/v1/chat/%2e%2e/%2e%2e/admin.txt?x=1",
        "/v1/../../../admin.txt",
        "/v1/..%2fadmin.txt",  # servers that decode %2f would resolve the ".." themselves
        "/v1/..%5Cadmin.txt",
        "/v1/..;/admin.txt",  # as Tomcat reads it
        "/local/v1/../../v1/models",  # out of the prefix it was sent to, into another's
    ],
)
async def test_paths_that_leave_the_base_path_never_reach_the_upstream(
    upstream: FakeUpstream, make_proxy: Any, path: str
) -> None:
    proxy = await make_proxy(
        upstreams=(
            Upstream("openai", upstream.url, "/v1"),
            Upstream("local", upstream.url, "/local/v1"),
        )
    )
    url = URL(proxy.url + path, encoded=True)  # sent exactly so, not resolved by the client
    status, headers, body = await _get(url)
    assert status == 400
    assert "leaves the base path" in _assert_openai_error(body, "invalid_request_error")["message"]
    assert upstream.seen == []
    [exchange] = await proxy.recorder.wait_for(1)
    assert (exchange.status, exchange.outcome) == (400, "proxy_error")
    assert headers["X-Flightrec-Id"] == exchange.id


@pytest.mark.parametrize(
    ("path", "upstream_path"),
    [
        ("/v1/./models", "/v1/models"),
        ("/v1/files/../models?limit=2", "/v1/models?limit=2"),
        ("/v1/files/%2E%2E/models", "/v1/models"),
        ("/v1/models/meta%2Fllama-3.1", "/v1/models/meta%2Fllama-3.1"),
    ],
)
async def test_dot_segments_inside_the_base_path_are_resolved(
    upstream: FakeUpstream, proxy: RunningProxy, path: str, upstream_path: str
) -> None:
    await _get(URL(proxy.url + path, encoded=True))
    assert upstream.seen[-1].path_qs == upstream_path


SECRETS = {
    "bearer": "sk-proj-LongSecretKey0123456789abcdefWXYZ",
    "short": "kZ7qW2xP",  # under 12 characters: no part of it may show in the hint
    "azure": "AzureKey5f3e9c1b7a2d4e6f8a0b1c2d3e4f5a6b",
    "x-api-key": "XApiKey-9b8a7c6d5e4f3a2b1c0d9e8f7a6b5c4d",
    "query-key": "QueryKeyAIzaSyD-0123456789abcdef",
    "query-api_key": "QueryApiKey-fedcba9876543210",
    "query-Api-Key": "QueryApiKeyCased-0a1b2c3d4e5f",
}


async def test_api_key_never_reaches_database_or_spool(
    upstream: FakeUpstream, tmp_path: Path, sdk: Sdk
) -> None:
    """Keys sent every way a client sends them, through the proxy to a real SQLite recorder,
    part of the time with the database locked so that records wait on disk: no file the
    proxy wrote holds any of them, and the upstream still got each."""
    db = tmp_path / "flightrec.db"
    await upgrade(f"sqlite+aiosqlite:///{db}")
    config = replace(
        Config(),
        upstreams=(Upstream("openai", upstream.url, "/v1"),),
        db_url=f"sqlite+aiosqlite:///{db}",
        spool_path=str(tmp_path / "flightrec.spool"),
        batch_interval=0.01,
        queue_size=2,
    )
    runner = make_runner(build_app(config, DatabaseRecorder(config)), config)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    base = f"http://{host}:{port}/v1"
    requests = [
        ("/models", {"Authorization": f"Bearer {SECRETS['bearer']}"}),
        ("/models", {"Authorization": f"Bearer {SECRETS['short']}"}),
        ("/models", {"api-key": SECRETS["azure"]}),
        ("/models", {"X-Api-Key": SECRETS["x-api-key"]}),
        (f"/models?key={SECRETS['query-key']}", {}),
        (f"/models?limit=2&api_key={SECRETS['query-api_key']}", {}),
        (f"/models?Api-Key={SECRETS['query-Api-Key']}&after=x", {}),
    ]
    lock = sqlite3.connect(db, isolation_level=None)
    try:
        lock.execute("BEGIN EXCLUSIVE")  # records wait: in the spool, or whatever holds them
        for path, headers in requests * 3:
            assert (await _get(base + path, headers=headers))[0] == 200
        client = sdk(base, SECRETS["bearer"])
        async for _ in await client.chat.completions.create(model="m", messages=[], stream=True):
            pass
        await asyncio.sleep(0.2)
        waiting = _files_without_secrets(tmp_path)
        assert any(size for name, size in waiting.items() if not name.startswith(db.name))
    finally:
        lock.execute("COMMIT")
        lock.close()
    await runner.cleanup()

    seen = " ".join(s.path_qs + " " + " ".join(s.headers.values()) for s in upstream.seen)
    assert all(secret in seen for secret in SECRETS.values())
    rows = sqlite3.connect(db).execute("SELECT query, key_hint FROM exchanges").fetchall()
    assert len(rows) == len(requests) * 3 + 1
    assert {query for query, _ in rows} == {
        "",
        "key=***",
        "limit=2&api_key=***",
        "Api-Key=***&after=x",
    }
    assert {hint for _, hint in rows} == {None, "sk-...WXYZ", "...", "Azu...5a6b", "XAp...5c4d"}
    assert _files_without_secrets(tmp_path)[db.name] > 0


def _files_without_secrets(directory: Path) -> dict[str, int]:
    """The size of each file under `directory`, once checked for every secret."""
    sizes = {}
    for path in directory.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for name, secret in SECRETS.items():
                assert secret.encode() not in data, (name, path.name)
            sizes[path.name] = len(data)
    return sizes


async def test_a_body_dribbled_slower_than_client_body_timeout_gets_408(
    upstream: FakeUpstream, make_proxy: Any
) -> None:
    proxy = await make_proxy(client_body_timeout=0.5)
    address = URL(proxy.url)
    reader, writer = await asyncio.open_connection(address.host, address.port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b'Content-Length: 100\r\n\r\n{"model":'
    )

    async def dribble() -> None:
        for _ in range(100):  # one byte every 0.1 s: the body would take 10 s
            await asyncio.sleep(0.1)
            if writer.is_closing() or reader.at_eof():
                return
            writer.write(b" ")

    dribbling = asyncio.create_task(dribble())
    try:
        answer = await asyncio.wait_for(reader.read(), 5)  # to the end: the proxy closes
    finally:
        dribbling.cancel()
        writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    assert "client_body_timeout" in _assert_openai_error(body, "invalid_request_error")["message"]
    assert upstream.seen == []
    [exchange] = await proxy.recorder.wait_for(1)
    assert (exchange.status, exchange.outcome) == (408, "proxy_error")


@pytest.mark.parametrize(
    ("omit", "request_kept", "response_kept"),
    [
        ("request", False, True),
        ("response", True, False),
        ("all", False, False),
        ("Response , REQUEST", False, False),
        ("nothing-known", True, True),
    ],
)
async def test_omit_drops_exactly_the_bodies_it_names(
    upstream: FakeUpstream,
    proxy: RunningProxy,
    sdk: Sdk,
    omit: str,
    request_kept: bool,
    response_kept: bool,
) -> None:
    client = sdk(proxy.base_url, KEY)
    messages: Any = [{"role": "user", "content": "private"}]
    headers = {"X-Flightrec-Omit": omit}
    await client.chat.completions.create(model="gpt-4o", messages=messages, extra_headers=headers)
    stream = await client.chat.completions.create(
        model="gpt-4o", messages=messages, stream=True, extra_headers=headers
    )
    [_ async for _ in stream]
    for exchange in await proxy.recorder.wait_for(2):
        assert (exchange.request_body is not None) is request_kept
        assert (exchange.request_json is not None) is request_kept
        assert (exchange.response_json is not None) is response_kept
        assert (exchange.raw_stream_gz is not None) is (response_kept and exchange.stream)
        assert exchange.omit_request is not request_kept
        assert exchange.omit_response is not response_kept
        assert exchange.usage == upstream.completion["usage"] and exchange.model == "gpt-4o"


async def test_an_upstream_silent_mid_stream_is_a_timeout(
    upstream: FakeUpstream, make_proxy: Any
) -> None:
    first = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'

    async def silent(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(first)
        await asyncio.sleep(5)
        return response

    upstream.override = silent
    proxy = await make_proxy(read_timeout=0.3)
    assert await _read_cut_stream(proxy.base_url) == first  # cut for the client too
    [exchange] = await proxy.recorder.wait_for(1)
    assert (exchange.outcome, exchange.status) == ("timeout", 200)
    assert "silent" in (exchange.error or "")
    assert exchange.response_json["choices"][0]["message"]["content"] == "a"
