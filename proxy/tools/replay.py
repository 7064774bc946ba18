"""Replay: re-send stored requests through flightrec's own forwarding path, then compare.

Like mitmproxy's client playback, a replay is ordinary traffic: `replay` starts the very
application `serve` runs (`build_app` with the database recorder) on an ephemeral 127.0.0.1
port and sends each stored request to it as a client would, marked `X-Flightrec-Replay-Of`.
So a replay gets the same header handling, usage injection, tee, outcomes and record as live
traffic, and its exchange is linked to the original. Once the app is closed (the recorder has
written everything), both records are read back and compared.

Keys are never stored: each request carries the key from the upstream's `api_key_env` (or
`--api-key-env`).
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.config import Config, Upstream
from proxy.relay.app import build_app, make_runner
from proxy.relay.paths import relative_path
from proxy.store.engine import StoreError
from proxy.store.filters import Filters
from proxy.store.read import get_exchange, reading
from proxy.store.recorder import open_recorder
from proxy.store.scan import select_ids
from proxy.tools.compare import compare, failed, render


class ReplayError(Exception):
    """A replay cannot be made as asked; one line for the user."""


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    model: str | None = None
    """Send the request to this model instead."""
    upstream: str | None = None
    """Send it to this configured upstream instead of the one it went to."""
    stream: bool | None = None
    """Force streaming on or off; None keeps what the client asked."""
    concurrency: int = 4
    api_key_env: str | None = None
    """Environment variable with the key, instead of the upstream's `api_key_env`."""
    allow_redacted: bool = False
    """Replay exchanges `[[redact]]` rules matched, replacements and all."""


@dataclass(slots=True)
class _Job:
    original: dict[str, Any]
    upstream: Upstream
    url: str
    body: bytes
    key: str
    replay_id: str | None = None
    error: str | None = None
    """Why the replay's answer did not arrive whole (the record says more, if it exists)."""


def replay_body(request: dict[str, Any], options: ReplayOptions) -> dict[str, Any]:
    body = dict(request)
    if options.model is not None:
        body["model"] = options.model
    if options.stream is True:
        body["stream"] = True
    elif options.stream is False:
        body.pop("stream", None)
        body.pop("stream_options", None)
    return body


def _upstream(config: Config, name: str) -> Upstream:
    for upstream in config.upstreams:
        if upstream.name == name:
            return upstream
    known = ", ".join(u.name for u in config.upstreams)
    raise ReplayError(f"no upstream named {name!r} in the config (configured: {known})")


def _key(upstream: Upstream, api_key_env: str | None, env: Mapping[str, str]) -> str:
    var = api_key_env or upstream.api_key_env
    key = env.get(var)
    if not key:
        raise ReplayError(
            f"no API key for upstream {upstream.name!r}: set ${var} "
            "(keys are never stored, so replay needs one; --api-key-env names another variable)"
        )
    return key


def _job(
    config: Config, original: dict[str, Any], options: ReplayOptions, env: Mapping[str, str]
) -> _Job:
    id_ = original["id"]
    request = original["request"]
    if original["request_omitted"]:
        raise ReplayError(
            f"exchange {id_}: its request body was not stored "
            "(X-Flightrec-Omit, store_bodies or retention_bodies_days)"
        )
    if not isinstance(request, dict):
        raise ReplayError(f"exchange {id_}: only JSON request bodies can be replayed")
    if original["method"] == "WS":
        raise ReplayError(
            f"exchange {id_}: a Realtime WebSocket response cannot be re-sent over HTTP"
        )
    if (rules := redacted_by(original)) and not options.allow_redacted:
        raise ReplayError(
            f"exchange {id_}: redacted by {', '.join(rules)}, so its request may hold the "
            "replacements instead of what was sent; --allow-redacted replays it as stored"
        )
    if options.upstream is None:
        try:
            upstream = _upstream(config, original["upstream"])
        except ReplayError:
            raise ReplayError(
                f"exchange {id_} went to upstream {original['upstream']!r}, which is not "
                "configured: choose one with --upstream"
            ) from None
    else:
        upstream = _upstream(config, options.upstream)
    rest = relative_path(config.upstreams, original["upstream"], original["path"])
    if rest is None:
        raise ReplayError(f"exchange {id_}: no configured upstream serves {original['path']}")
    prefix = "" if upstream.prefix == "/" else upstream.prefix
    query = f"?{original['query']}" if original["query"] else ""
    return _Job(
        original=original,
        upstream=upstream,
        url=f"{prefix}{rest}{query}",
        body=orjson.dumps(replay_body(request, options)),
        key=_key(upstream, options.api_key_env, env),
    )


def redacted_by(original: dict[str, Any]) -> list[str]:
    """The `[[redact]]` rules that matched an exchange (its `redacted` note); [] if none."""
    note = original.get("redacted")
    rules = note.get("rules") if isinstance(note, dict) else None
    return [str(rule) for rule in rules] if isinstance(rules, list) else []


async def _originals(
    config: Config, ids: list[str], filters: Filters | None, allow_redacted: bool
) -> list[dict[str, Any]]:
    async with reading(config.db_url) as engine:
        if filters is not None:
            found = [await get_exchange(engine, id_) for id_ in await select_ids(engine, filters)]
            # Chosen by filter, an exchange that cannot be replayed is left out, not an error.
            return [
                o
                for o in found
                if isinstance(o["request"], dict)
                and o["method"] != "WS"
                and (allow_redacted or not redacted_by(o))
            ]
        return [await get_exchange(engine, id_) for id_ in ids]


async def replay(
    config: Config,
    ids: list[str],
    options: ReplayOptions,
    *,
    filters: Filters | None = None,
    env: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Replay the exchanges `ids` (or those `filters` selects); one comparison per replay."""
    env = os.environ if env is None else env
    originals = await _originals(config, ids, filters, options.allow_redacted)
    if not originals:
        raise ReplayError("no recorded exchange matches: nothing to replay")
    jobs = [_job(config, original, options, env) for original in originals]
    await _send(config, jobs, options.concurrency)
    async with reading(config.db_url) as engine:
        return [await _comparison(engine, config, job) for job in jobs]


async def _comparison(engine: AsyncEngine, config: Config, job: _Job) -> dict[str, Any]:
    """The job's comparison; one saying what went wrong when there is no record to compare."""
    if job.replay_id is None:
        return failed(job.original, job.error or "no answer")
    try:
        replayed = await get_exchange(engine, job.replay_id)
    except StoreError:
        where = f"journaled in {config.spool_path}.replay while the database was unavailable"
        return failed(job.original, f"replay {job.replay_id} is not in the database yet ({where})")
    comparison = compare(job.original, replayed)
    if job.error and not comparison["error"]:
        comparison["error"] = job.error
    return comparison


_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")


def carried_over(original: dict[str, Any]) -> dict[str, str]:
    """The original's tags and user, as the control headers that set them on the replay.
    A tag whose key or value cannot travel in a header (a newline, say) stays behind."""
    headers = {
        f"X-Flightrec-Tag-{key}": value
        for key, value in original["tags"].items()
        if _HEADER_NAME.match(key) and "\r" not in value and "\n" not in value
    }
    user = original["user"]
    if user and "\r" not in user and "\n" not in user:
        headers["X-Flightrec-User"] = user
    return headers


async def _send(config: Config, jobs: list[_Job], concurrency: int) -> None:
    """Through an in-process flightrec on an ephemeral port; returns once everything is
    recorded. Its own journal, so a `serve` running from the same directory is no obstacle."""
    local = replace(config, host="127.0.0.1", port=0, spool_path=config.spool_path + ".replay")
    recorder = await open_recorder(local)
    runner = make_runner(build_app(local, recorder), local)
    try:
        await runner.setup()
    except BaseException:
        await recorder.stop()
        raise
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        root = f"http://127.0.0.1:{runner.addresses[0][1]}"
        limit = asyncio.Semaphore(max(1, concurrency))
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(timeout=timeout) as session:

            async def one(job: _Job) -> None:
                headers = {
                    "Content-Type": "application/json",
                    "Authorization": f"Bearer {job.key}",
                    "X-Flightrec-Replay-Of": job.original["id"],
                    **carried_over(job.original),
                }
                method, url = job.original["method"], root + job.url
                try:
                    async with (
                        limit,
                        session.request(method, url, data=job.body, headers=headers) as response,
                    ):
                        job.replay_id = response.headers.get("X-Flightrec-Id")
                        await response.read()
                        if job.replay_id is None:
                            job.error = f"got {response.status} without a record"
                except aiohttp.ClientError as exc:  # this replay's own end: the others go on
                    job.error = f"the answer broke off: {type(exc).__name__}: {exc}"

            await asyncio.gather(*(one(job) for job in jobs))
    finally:
        await runner.cleanup()  # stops the app; the recorder writes out what it holds


__all__ = ["ReplayError", "ReplayOptions", "compare", "render", "replay"]
