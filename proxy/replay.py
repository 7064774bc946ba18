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
import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from .app import build_app, make_runner
from .config import Config, Upstream
from .dbrecorder import open_recorder
from .forward import match_upstream
from .store.engine import StoreError
from .store.read import get_exchange, reading
from .store.scan import Filters, select_ids

_VOLATILE = frozenset({"id", "created", "model", "system_fingerprint", "usage", "service_tier"})
"""Response fields that differ between two identical answers."""


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


@dataclass(slots=True)
class _Job:
    original: dict[str, Any]
    upstream: Upstream
    url: str
    body: bytes
    key: str
    replay_id: str | None = None


def relative_path(upstreams: tuple[Upstream, ...], upstream_name: str, path: str) -> str | None:
    """`path` without the prefix of the upstream it went to (else of the one that serves it now)."""
    for upstream in upstreams:
        prefix = "" if upstream.prefix == "/" else upstream.prefix
        if upstream.name == upstream_name and path.startswith(prefix):
            rest = path[len(prefix) :]
            if rest[:1] in ("", "/"):
                return rest
    found = match_upstream(upstreams, path)
    return None if found is None else found[1]


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
        raise ReplayError(f"exchange {id_}: its request body was not stored (X-Flightrec-Omit)")
    if not isinstance(request, dict):
        raise ReplayError(f"exchange {id_}: only JSON request bodies can be replayed")
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


async def _originals(
    config: Config, ids: list[str], filters: Filters | None
) -> list[dict[str, Any]]:
    async with reading(config.db_url) as engine:
        if filters is not None:
            found = [await get_exchange(engine, id_) for id_ in await select_ids(engine, filters)]
            # Chosen by filter, an exchange that cannot be replayed is left out, not an error.
            return [o for o in found if isinstance(o["request"], dict)]
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
    originals = await _originals(config, ids, filters)
    if not originals:
        raise ReplayError("no recorded exchange matches: nothing to replay")
    jobs = [_job(config, original, options, env) for original in originals]
    await _send(config, jobs, options.concurrency)
    async with reading(config.db_url) as engine:
        comparisons = []
        for job in jobs:
            assert job.replay_id is not None
            try:
                replayed = await get_exchange(engine, job.replay_id)
            except StoreError:
                raise ReplayError(
                    f"replay {job.replay_id} of {job.original['id']} is not in the database yet "
                    f"(journaled in {config.spool_path}.replay while it was unavailable)"
                ) from None
            comparisons.append(compare(job.original, replayed))
    return comparisons


async def _send(config: Config, jobs: list[_Job], concurrency: int) -> None:
    """Through an in-process flightrec on an ephemeral port; returns once everything is
    recorded. Its own journal, so a `serve` running from the same directory is no obstacle."""
    local = replace(config, host="127.0.0.1", port=0, spool_path=config.spool_path + ".replay")
    recorder = await open_recorder(local)
    runner = make_runner(build_app(local, recorder), local)
    try:
        await runner.setup()
    except BaseException:
        await recorder.close()
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
                }
                method, url = job.original["method"], root + job.url
                async with (
                    limit,
                    session.request(method, url, data=job.body, headers=headers) as response,
                ):
                    await response.read()
                    job.replay_id = response.headers.get("X-Flightrec-Id")
                if job.replay_id is None:
                    raise ReplayError(f"replaying {job.original['id']}: got {response.status}")

            await asyncio.gather(*(one(job) for job in jobs))
    finally:
        await runner.cleanup()  # stops the app; the recorder writes out what it holds


# --- Comparison ---


def _choices(response: Any) -> list[dict[str, Any]]:
    found = response.get("choices") if isinstance(response, dict) else None
    if not isinstance(found, list):
        return []
    choices = [c for c in found if isinstance(c, dict)]
    return sorted(choices, key=lambda c: c["index"] if isinstance(c.get("index"), int) else 0)


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts
        return "".join(str(p.get("text", "")) for p in value if isinstance(p, dict)) or None
    return None


def content_of(response: Any) -> str | None:
    """The generated text: message content (or refusal) of each choice, a legacy completion's
    `text`, or a Responses API answer's output text. None when the response has none."""
    choices = _choices(response)
    parts: list[str] = []
    for choice in choices:
        message = choice.get("message")
        if isinstance(message, dict):
            text = _text(message.get("content")) or _text(message.get("refusal"))
        else:
            text = _text(choice.get("text"))
        if text is not None:
            parts.append(text if len(choices) == 1 else f"[{choice.get('index')}] {text}")
    output = response.get("output") if isinstance(response, dict) else None
    for item in output if isinstance(output, list) else []:
        content = item.get("content") if isinstance(item, dict) else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and part.get("type") == "output_text":
                parts.append(str(part.get("text", "")))
    return "\n".join(parts) if parts else None


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def tool_calls_of(response: Any) -> list[list[tuple[Any, Any]]]:
    """Per choice, the calls as (name, arguments): call ids are random, argument JSON is
    compared parsed, so whitespace does not count as a change."""
    calls = []
    for choice in _choices(response):
        found_message = choice.get("message")
        message: dict[str, Any] = found_message if isinstance(found_message, dict) else {}
        found = [c.get("function") for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        if isinstance(message.get("function_call"), dict):
            found.append(message["function_call"])
        calls.append(
            [(f.get("name"), _arguments(f.get("arguments"))) for f in found if isinstance(f, dict)]
        )
    return calls


def _finish_reasons(response: Any) -> list[Any]:
    reasons = [choice.get("finish_reason") for choice in _choices(response)]
    if not reasons and isinstance(response, dict) and "output" in response:
        reasons = [response.get("status")]
    return reasons


def _tokens(usage: Any, *names: str) -> int | None:
    if not isinstance(usage, dict):
        return None
    for name in names:
        value = usage.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _delta(new: float | None, old: float | None, digits: int) -> float | None:
    return None if new is None or old is None else round(new - old, digits)


def _stripped(response: Any) -> Any:
    if isinstance(response, dict):
        return {k: v for k, v in response.items() if k not in _VOLATILE}
    return response


def content_diff(original: str | None, replayed: str | None) -> str:
    """A unified diff of two answers' text; empty when they are the same."""
    if original == replayed:
        return ""
    return "".join(
        difflib.unified_diff(
            (original or "").splitlines(keepends=True),
            (replayed or "").splitlines(keepends=True),
            "original",
            "replay",
        )
    )


def compare(original: dict[str, Any], replayed: dict[str, Any]) -> dict[str, Any]:
    """One `replay --json` object: what changed between an exchange and its replay."""
    old, new = original["response"], replayed["response"]
    old_text, new_text = content_of(old), content_of(new)
    same_content = (
        old_text == new_text
        if old_text is not None or new_text is not None
        else _stripped(old) == _stripped(new)
    )
    old_fp, new_fp = original["system_fingerprint"], replayed["system_fingerprint"]
    old_usage, new_usage = original["usage"], replayed["usage"]
    usage_delta = {
        name: _delta(_tokens(new_usage, *names), _tokens(old_usage, *names), 0)
        for name, names in (
            ("prompt_tokens", ("prompt_tokens", "input_tokens")),
            ("completion_tokens", ("completion_tokens", "output_tokens")),
            ("total_tokens", ("total_tokens",)),
        )
    }
    return {
        "original": original["id"],
        "replay": replayed["id"],
        "original_model": original["response_model"] or original["model"],
        "replay_model": replayed["response_model"] or replayed["model"],
        "status": replayed["status"],
        "outcome": replayed["outcome"],
        "error": replayed["error"],
        "same_content": same_content and original["outcome"] == replayed["outcome"],
        "same_tool_calls": tool_calls_of(old) == tool_calls_of(new),
        "same_finish_reason": _finish_reasons(old) == _finish_reasons(new),
        "fingerprint_changed": None if old_fp is None or new_fp is None else old_fp != new_fp,
        "usage_delta": {k: None if v is None else int(v) for k, v in usage_delta.items()},
        "cost_delta_usd": _delta(replayed["cost_usd"], original["cost_usd"], 10),
        "latency_delta_ms": _delta(replayed["duration_ms"], original["duration_ms"], 1),
        "diff": content_diff(old_text, new_text),
    }


def _signed(value: float | None, unit: str = "", digits: int = 0) -> str:
    return "?" if value is None else f"{value:+.{digits}f}{unit}"


def render(comparisons: list[dict[str, Any]]) -> str:
    """`replay` for people: one block per replay, with the text diff when the answer changed."""
    blocks = []
    for c in comparisons:
        usage = c["usage_delta"]
        fingerprint = {None: "unknown", True: "changed", False: "same"}[c["fingerprint_changed"]]
        lines = [
            f"{c['original']} -> {c['replay']}  ({c['original_model']} -> {c['replay_model']}, "
            f"{c['status']} {c['outcome']})",
            f"  content {'same' if c['same_content'] else 'DIFFERS'}, "
            f"tool calls {'same' if c['same_tool_calls'] else 'DIFFER'}, "
            f"finish reason {'same' if c['same_finish_reason'] else 'DIFFERS'}, "
            f"fingerprint {fingerprint}",
            f"  tokens prompt {_signed(usage['prompt_tokens'])}, "
            f"completion {_signed(usage['completion_tokens'])}; "
            f"cost {_signed(c['cost_delta_usd'], ' USD', 6)}; "
            f"latency {_signed(c['latency_delta_ms'], ' ms')}",
        ]
        if c["error"]:
            lines.append(f"  error: {c['error']}")
        if c["diff"]:
            lines.append(c["diff"].rstrip("\n"))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
