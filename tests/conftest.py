"""Real parts for the tests: a fake OpenAI upstream (a real aiohttp app) and the real proxy,
built by `proxy.app` exactly as `flightrec serve` builds it, each on a port the system picks
as it binds (`start_site`); a process a test starts gets a port held for it (`reserved_port`)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import random
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web
from hypothesis import settings

from proxy.config import Config, Upstream
from proxy.relay.app import build_app, make_runner
from proxy.sinks.fanout import MemoryRecorder
from tests.streamgen import chunks_to_sse, completion_to_chunks

# Property tests check what holds, not how fast: on a busy 2-core CI machine the first example
# of a test (cold imports, caches) can take longer than hypothesis's 200 ms default deadline.
settings.register_profile("flightrec", deadline=None)
settings.load_profile("flightrec")

CAPTURES = Path(__file__).resolve().parents[2] / "shared" / "captures" / "openai-python"
"""Real OpenAI streams, found beside the checkout (`<repo>/../shared`), never copied into it."""


def captures() -> list[Any]:
    """Each capture as a pytest param named after it; without the folder, one param that skips
    and says where the captures were looked for."""
    paths = sorted(CAPTURES.glob("*.sse")) if CAPTURES.is_dir() else []
    if not paths:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no captures in {CAPTURES}"))]
    return [pytest.param(path, id=path.stem) for path in paths]


async def start_site(runner: web.AppRunner) -> str:
    """Serve `runner` on a port the system picks; its root URL. The port is bound once, by
    the server itself: no window in which another process could take it."""
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return f"http://127.0.0.1:{site.port}"


@contextlib.contextmanager
def reserved_port() -> Iterator[int]:
    """A port held bound (not listening) while the block runs. Nothing else is given it, a
    connection to it is refused, and a server that binds with SO_REUSEADDR (aiohttp, so
    `flightrec serve` and `playback`; `http.server`) may take it over and listen: how a test
    hands a port to a process it starts."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):  # for servers that share the port (`--workers`)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


async def until(condition: Callable[[], bool], within: float = 10) -> None:
    """Until `condition()` holds, looking every few ms; AssertionError after `within` s."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


async def wait_until_up(url: str, process: asyncio.subprocess.Process, within: float = 30) -> None:
    """Until GET `url` answers 200; AssertionError when `process` exits first or after
    `within` seconds."""
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as session:
        while process.returncode is None and time.monotonic() < deadline:
            try:
                async with session.get(url) as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} did not come up (process exit status {process.returncode})")


def completion(**overrides: Any) -> dict[str, Any]:
    """A plain non-streaming chat completion, with multi-byte UTF-8 in its content."""
    base: dict[str, Any] = {
        "id": "chatcmpl-test1",
        "object": "chat.completion",
        "created": 1_723_024_748,
        "model": "gpt-4o-mini-2024-07-18",
        "system_fingerprint": "fp_test",
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "Héllo wörld — 世界 🚀!",
                    "refusal": None,
                },
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21},
    }
    base.update(overrides)
    return base


@dataclass
class Seen:
    method: str
    path_qs: str
    headers: dict[str, str]
    body: bytes


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@contextlib.asynccontextmanager
async def serving(path: str, handler: Handler) -> AsyncIterator[str]:
    """A real aiohttp server answering POST `path` with `handler` while the block runs; its
    root URL."""
    app = web.Application()
    app.router.add_post(path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        yield await start_site(runner)
    finally:
        await runner.cleanup()


@dataclass
class FakeUpstream:
    """An OpenAI-like upstream. Chat completions answer with `completion`, streamed as OpenAI
    streams it (or as the exact `sse_body` bytes), written in `piece_size` pieces."""

    completion: dict[str, Any] = field(default_factory=completion)
    sse_body: bytes | None = None
    piece_size: int | None = None
    by_event: bool = False
    """Write the body one SSE event at a time (each piece ends with its blank line)."""
    pause: float = 0.0
    compress: bool = False
    seen: list[Seen] = field(default_factory=list)
    sent: bytearray = field(default_factory=bytearray)
    """The body bytes of the last response, as written."""
    override: Handler | None = None
    url: str = ""

    def stream_body(self, include_usage: bool) -> bytes:
        if self.sse_body is not None:
            return self.sse_body
        chunks = completion_to_chunks(
            self.completion, include_usage=include_usage, rng=random.Random(7)
        )
        return chunks_to_sse(chunks)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(Seen(request.method, request.path_qs, dict(request.headers), body))
        if self.override is not None:
            return await self.override(request)
        path = request.path
        if path == "/v1/chat/completions":
            payload = orjson.loads(body)
            if "stream_options" in payload and payload.get("stream") is not True:
                # As OpenAI answers it.
                message = "The 'stream_options' parameter is only allowed when 'stream' is enabled."
                error: dict[str, Any] = {"message": message, "type": "invalid_request_error"}
                error |= {"param": "stream_options", "code": None}
                return web.json_response({"error": error}, status=400)
            if payload.get("stream"):
                options = payload.get("stream_options") or {}
                data = self.stream_body(bool(options.get("include_usage")))
                return await self._write(request, data, "text/event-stream")
            return await self._write(request, orjson.dumps(self.completion), "application/json")
        if path == "/v1/models":
            models = {"object": "list", "data": [{"id": "gpt-4o", "object": "model"}]}
            return await self._write(request, orjson.dumps(models), "application/json")
        if path == "/v1/embeddings":
            answer = {
                "object": "list",
                "data": [{"object": "embedding", "index": 0, "embedding": [0.25, -0.5]}],
                "model": "text-embedding-3-small",
                "usage": {"prompt_tokens": 5, "total_tokens": 5},
            }
            return await self._write(request, orjson.dumps(answer), "application/json")
        error = {
            "error": {
                "message": "Unknown",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
        return web.Response(status=404, body=orjson.dumps(error), content_type="application/json")

    async def _write(
        self, request: web.Request, data: bytes, content_type: str
    ) -> web.StreamResponse:
        self.sent = bytearray()
        response = web.StreamResponse(
            headers={"Content-Type": content_type, "x-request-id": "req_fake123"}
        )
        if self.compress:
            data = gzip.compress(data)
            response.headers["Content-Encoding"] = "gzip"
        if content_type == "application/json" and not self.piece_size:
            response.content_length = len(data)
        await response.prepare(request)
        size = self.piece_size or len(data) or 1
        pieces = [data[start : start + size] for start in range(0, len(data), size)]
        if self.by_event:
            pieces = [piece for piece in re.split(rb"(?<=\n\n)|(?<=\n\r\n)", data) if piece]
        for piece in pieces:
            await response.write(piece)
            self.sent += piece
            if self.pause:
                await asyncio.sleep(self.pause)
        await response.write_eof()
        return response


async def _serve(app: web.Application, runner: web.AppRunner | None = None) -> tuple[str, Any]:
    runner = runner or web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    return await start_site(runner), runner


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    app = web.Application(client_max_size=1 << 30)
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    url, runner = await _serve(app)
    fake.url = url + "/v1"
    yield fake
    await runner.cleanup()


@dataclass
class RunningProxy:
    url: str
    """Root URL; the OpenAI base_url is `url + "/v1"`."""
    recorder: MemoryRecorder
    config: Config

    @property
    def base_url(self) -> str:
        return self.url + "/v1"


ProxyFactory = Callable[..., Awaitable[RunningProxy]]


@pytest.fixture
async def make_proxy(upstream: FakeUpstream) -> AsyncIterator[ProxyFactory]:
    runners: list[web.AppRunner] = []

    async def start(**overrides: Any) -> RunningProxy:
        upstreams = overrides.pop("upstreams", (Upstream("openai", upstream.url, "/v1"),))
        sinks = overrides.pop("sinks", ())
        config = replace(Config(), upstreams=upstreams, **overrides)
        recorder = MemoryRecorder()
        app = build_app(config, recorder, sinks=sinks)
        url, runner = await _serve(app, make_runner(app, config))
        runners.append(runner)
        return RunningProxy(url, recorder, config)

    yield start
    for runner in runners:
        await runner.cleanup()


Sdk = Callable[..., openai.AsyncOpenAI]


@pytest.fixture
async def sdk() -> AsyncIterator[Sdk]:
    """The real OpenAI client, closed when the test ends. One left to the garbage collector
    closes itself in a task on whatever loop runs by then, and a later test sees its error."""
    clients: list[openai.AsyncOpenAI] = []

    def make(base_url: str, api_key: str, **options: Any) -> openai.AsyncOpenAI:
        clients.append(openai.AsyncOpenAI(base_url=base_url, api_key=api_key, **options))
        return clients[-1]

    yield make
    for client in clients:
        await client.close()


@pytest.fixture
async def proxy(make_proxy: ProxyFactory) -> RunningProxy:
    return await make_proxy()
