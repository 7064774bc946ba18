"""Playback: recorded answers served as a deterministic mock upstream.

At start, playback walks the stored requests once (`store.scan.stream_requests`, a cursor, not
a table in memory) and keeps one small entry per distinct request: a SHA-256 of method, path
under the upstream's prefix, query and canonical body (the request JSON with sorted keys, less
the `--match ignore-fields` paths) mapped to the id of the newest successful exchange. Hashing
at start rather than in a stored column keeps `--match ignore-fields` free to ignore anything,
and keeps the record's hot write path as it is; the index costs about 100 bytes per distinct
request.

The server is the application `serve` runs (`build_app`), with a middleware in front: a request
that matches gets the recorded answer, read from the database when asked for. A stream is the
exact bytes its client received (`raw_streams`), optionally with their recorded pacing; a
non-stream is its recorded body. A miss gets an OpenAI-shaped 404, or with `--miss forward`
falls through to the real `forward` handler, which relays it upstream and records it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

import orjson
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.config import Config, Upstream
from proxy.relay.app import build_app, make_runner
from proxy.relay.appkeys import APP_CONFIG
from proxy.relay.errors import error_response
from proxy.relay.paths import mask_query, match_upstream, relative_path
from proxy.sinks.fanout import MemoryRecorder, Recorder
from proxy.store.read import reading
from proxy.store.scan import Recorded, get_recorded, stream_requests

log = logging.getLogger(__name__)

GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True, slots=True)
class PlaybackOptions:
    ignore_fields: tuple[str, ...] = ()
    """Body fields left out of the match: top-level names or dotted paths (`metadata.trace`);
    a path through a list applies to each of its items. Empty: exact match."""
    miss: Literal["error", "forward"] = "error"
    timing: Literal["recorded", "fast"] = "fast"
    errors: bool = False
    """Also play back the upstream's error answers (a 429, a 500): each request's recorded
    answers in the order they came, so a client's retries meet the failures and then the
    success it met."""


def _drop(value: Any, path: list[str]) -> Any:
    if isinstance(value, list):
        return [_drop(item, path) for item in value]
    if not isinstance(value, dict) or not path:
        return value
    head, rest = path[0], path[1:]
    if not rest:
        return {k: v for k, v in value.items() if k != head}
    return {k: _drop(v, rest) if k == head else v for k, v in value.items()}


def canonical(body: Any, ignore_fields: tuple[str, ...] = ()) -> bytes:
    """The request body as playback compares it: keys sorted, ignored fields removed."""
    if body is None:
        return b""
    for field in ignore_fields:
        body = _drop(body, field.split("."))
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)


def request_key(method: str, rest: str, query: str, body: bytes) -> bytes:
    digest = hashlib.sha256()
    for part in (method.upper().encode(), rest.encode(), query.encode()):
        digest.update(part + b"\0")
    digest.update(body)
    return digest.digest()


async def load_index(
    engine: AsyncEngine,
    upstreams: tuple[Upstream, ...],
    ignore_fields: tuple[str, ...],
    errors: bool = False,
) -> dict[bytes, list[str]]:
    """Request key -> the id of the newest successful exchange with that request; with
    `errors`, the ids of all its answered exchanges, errors included, oldest first."""
    index: dict[bytes, list[str]] = {}
    async for stored in stream_requests(engine, errors=errors):
        rest = relative_path(upstreams, stored.upstream, stored.path)
        if rest is None:
            continue
        body = canonical(stored.body, ignore_fields)
        key = request_key(stored.method, rest, stored.query, body)
        if errors:
            index.setdefault(key, []).append(stored.id)
        else:
            index[key] = [stored.id]
    return index


@dataclass(slots=True)
class Playback:
    engine: AsyncEngine
    index: dict[bytes, list[str]]
    options: PlaybackOptions
    asked: dict[bytes, int] = dataclasses.field(default_factory=dict)
    """How often each request was asked for: the n-th gets the n-th recorded answer (the
    last one again once they run out)."""

    def next_id(self, key: bytes) -> str | None:
        ids = self.index.get(key)
        if not ids:
            return None
        n = self.asked.get(key, 0)
        self.asked[key] = n + 1
        return ids[min(n, len(ids) - 1)]


APP_PLAYBACK = web.AppKey("playback", Playback)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _playback(request: web.Request, handler: Handler) -> web.StreamResponse:
    arrived = time.monotonic()
    config = request.app[APP_CONFIG]
    route = match_upstream(config.upstreams, request.raw_path)
    if request.path in ("/healthz", "/readyz") or route is None:
        return await handler(request)  # health, or forward's OpenAI-shaped 404
    playback = request.app[APP_PLAYBACK]
    body = await request.read()  # aiohttp keeps it: `forward` reads it again on a miss
    try:
        payload = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        payload = None
    found = None
    rest = relative_path(config.upstreams, route[0].name, request.path)
    if rest is not None and (payload is not None or not body):
        canon = canonical(payload, playback.options.ignore_fields)
        query = mask_query(request.query_string)  # as the record keeps it
        found = playback.next_id(request_key(request.method, rest, query, canon))
    if found is None:
        if playback.options.miss == "forward":
            return await handler(request)
        return error_response(
            404,
            f"flightrec playback: no recorded exchange matches {request.method} {request.path} "
            "with this body",
            "invalid_request_error",
            "playback_miss",
        )
    try:
        recorded = await get_recorded(playback.engine, found)
    except Exception as exc:  # the database went away under us: say so in OpenAI's shape
        log.exception("playback could not read exchange %s", found)
        return error_response(500, f"flightrec playback: {exc}", "proxy_error")
    return await _answer(request, recorded, playback.options.timing == "recorded", arrived)


async def _answer(
    request: web.Request, recorded: Recorded, paced: bool, arrived: float
) -> web.StreamResponse:
    headers = {"X-Flightrec-Id": recorded.id, "X-Flightrec-Playback": "recorded"}
    if recorded.content_type:
        headers["Content-Type"] = recorded.content_type
    raw = recorded.raw_stream
    if raw is None:
        if paced and recorded.duration_ms:
            await asyncio.sleep(max(0.0, arrived + recorded.duration_ms / 1000 - time.monotonic()))
        return web.Response(status=recorded.status, body=recorded.body, headers=headers)
    if raw.startswith(GZIP_MAGIC):
        headers["Content-Encoding"] = "gzip"  # the upstream compressed it; so did the record
    response = web.StreamResponse(status=recorded.status, headers=headers)
    await response.prepare(request)
    sent = 0
    if paced:
        for offset, ms in recorded.pacing:
            await asyncio.sleep(max(0.0, arrived + ms / 1000 - time.monotonic()))
            await response.write(raw[sent:offset])
            sent = offset
    if sent < len(raw):
        await response.write(raw[sent:])
    await response.write_eof()
    return response


@dataclass(frozen=True, slots=True)
class Running:
    url: str
    recorded: int
    """Distinct recorded requests playback can answer."""


@contextlib.asynccontextmanager
async def playing(config: Config, options: PlaybackOptions) -> AsyncIterator[Running]:
    """Playback serving on `config.host`:`config.port` (0: any free port) until the block ends."""
    recorder: Recorder = MemoryRecorder()  # never used: without forwarding nothing is recorded
    if options.miss == "forward":
        from proxy.store.recorder import open_recorder

        # Its own journal, so a `serve` running from the same directory is no obstacle.
        config = replace(config, spool_path=config.spool_path + ".playback")
        recorder = await open_recorder(config)
    try:
        async with reading(config.db_url) as engine:
            index = await load_index(
                engine, config.upstreams, options.ignore_fields, options.errors
            )
            app = build_app(config, recorder)
            app[APP_PLAYBACK] = Playback(engine, index, options)
            app.middlewares.append(_playback)
            runner = make_runner(app, config)
            await runner.setup()
            try:
                await web.TCPSite(runner, config.host, config.port).start()
                host, port = runner.addresses[0][:2]
                yield Running(f"http://{host}:{port}", len(index))
            finally:
                await runner.cleanup()
    finally:
        await recorder.stop()  # idempotent: the app's cleanup closed it already


async def run(config: Config, options: PlaybackOptions) -> None:
    """Serve recorded answers until SIGTERM or SIGINT."""
    async with playing(config, options) as running:
        log.info(
            "flightrec playback on %s: %d recorded requests, misses %s",
            running.url,
            running.recorded,
            "forwarded upstream" if options.miss == "forward" else "answered 404",
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
