"""Redaction end to end: a secret and an e-mail address sent in a prompt, a tool-call argument,
a streamed answer (split across SSE events, with logprobs) and a query string, through a real
`flightrec serve` with the real openai SDK, appear in no file the proxy wrote (database and its
WAL, journal, log), no row (PostgreSQL read back by SQL, raw streams decompressed), no export
of any format and no OTLP span; the same run without rules finds them in each, so the test can
fail. The client's own bytes are never redacted."""

from __future__ import annotations

import asyncio
import gzip
import os
import signal
import sqlite3
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import openai
import orjson
import pytest
from aiohttp import web
from sqlalchemy.engine import make_url

from tests.conftest import reserved_port, serving, wait_until_up
from tests.dbs import db_url
from tests.recordings import cli

__all__ = ["db_url"]  # the fixture, used by name

SECRET = "sk-proj-Zq7Xw2Lm9Np4Rt6Vb8Hc1Jd3"
EMAIL = "jane.doe@example.org"
CARD = "4111 1111 1111 1111"  # Luhn-valid
ORDER = "4111 1111 1111 1112"  # the same digits, Luhn-invalid: an order id, kept
NEEDLES = (SECRET.encode(), EMAIL.encode(), CARD.encode())
KEY = "sk-test-the-client-key-000000000000"
RULES = "".join(f'[[redact]]\npreset = "{name}"\n' for name in ("api_key", "email", "card"))
STREAMED = f"Your key is {SECRET} and mail {EMAIL}."
PIECES = [
    *("Your key is sk-", "proj-Zq7Xw", "2Lm9Np4Rt6", "Vb8Hc1Jd3 and mail jane"),
    *(".doe@exa", "mple.org."),
]
TOOL_ARGS = orjson.dumps({"to": EMAIL, "token": SECRET}).decode()


def _chunk(delta: dict[str, Any], **extra: Any) -> bytes:
    chunk = {
        "id": "chatcmpl-r",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o-mini",
        "choices": [{"index": 0, "delta": delta, "finish_reason": None, **extra}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _stream() -> bytes:
    events = [_chunk({"role": "assistant", "content": ""})]
    for piece in PIECES:
        token = {"token": piece, "logprob": -0.5, "bytes": list(piece.encode()), "top_logprobs": []}
        events.append(_chunk({"content": piece}, logprobs={"content": [token]}))
    usage = {"prompt_tokens": 20, "completion_tokens": 6, "total_tokens": 26}
    end = {"id": "chatcmpl-r", "object": "chat.completion.chunk", "created": 1}
    end |= {"model": "gpt-4o-mini", "choices": [], "usage": usage}
    events.append(b"data: " + orjson.dumps(end) + b"\n\n")
    return b"".join(events) + b"data: [DONE]\n\n"


def _completion() -> dict[str, Any]:
    function = {"name": "send_mail", "arguments": TOOL_ARGS}
    call = {"id": "call_1", "type": "function", "function": function}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return {
        "id": "chatcmpl-t",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o-mini",
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": "tool_calls"}
        ],
        "usage": {"prompt_tokens": 30, "completion_tokens": 10, "total_tokens": 40},
    }


async def _answer(request: web.Request) -> web.StreamResponse:
    payload = await request.json()
    if not payload.get("stream"):
        return web.json_response(_completion())
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for event in _stream().split(b"\n\n")[:-1]:
        await response.write(event + b"\n\n")
    return response


@pytest.fixture
async def upstream() -> AsyncIterator[str]:
    async with serving("/v1/chat/completions", _answer) as url:
        yield url + "/v1"


@dataclass
class Collector:
    url: str = ""
    bodies: list[bytes] = field(default_factory=list)


@pytest.fixture
async def collector() -> AsyncIterator[Collector]:
    found = Collector()

    async def traces(request: web.Request) -> web.Response:
        found.bodies.append(await request.read())
        return web.Response(body=b"", content_type="application/x-protobuf")

    async with serving("/v1/traces", traces) as url:
        found.url = url + "/v1/traces"
        yield found


def _config(tmp_path: Path, db: str, collector: Collector, rules: str) -> Path:
    path = tmp_path / "flightrec.toml"
    text = (
        f'db_url = "{db}"\nspool_path = "{tmp_path / "journal"}"\nbatch_interval = 4.0\n'
        f'otlp_endpoint = "{collector.url}"\notlp_content = true\nstream_usage = "passthrough"\n'
    )
    path.write_text(text + rules)
    return path


async def _serve(tmp_path: Path, config: Path, upstream: str) -> tuple[Any, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}
    env |= {"FLIGHTREC_CONSOLE_PORT": "0", "FLIGHTREC_UPSTREAM": upstream}
    log = (tmp_path / "serve.log").open("wb")
    with reserved_port() as port:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port),
            env=env, stdout=log, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        url = f"http://127.0.0.1:{port}"
        await wait_until_up(url + "/readyz", process)
    return process, url


async def _exchanges(url: str) -> None:
    """A prompt and a tool-call argument, a tool call answered, a streamed answer with
    logprobs, each with the secret and the address in the query string too."""
    query = {"contact": EMAIL, "note": SECRET, "api_key": "qs-secret-value"}
    messages: list[Any] = [
        {"role": "user", "content": f"My key is {SECRET}, mail me at {EMAIL}; card {CARD}."},
        {"role": "user", "content": f"Order {ORDER}."},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "f", "arguments": TOOL_ARGS}}
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "content": "sent"},
    ]
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client:
        answer = await client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, extra_query=query, user=EMAIL
        )
        [call] = answer.choices[0].message.tool_calls or []
        assert call.type == "function"
        assert call.function.arguments == TOOL_ARGS  # the client's bytes are never redacted
        stream = await client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, stream=True, logprobs=True, extra_query=query
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == STREAMED


def _files(root: Path) -> dict[str, bytes]:
    """Every file under `root` but the test's own config, gzip members decompressed."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != "flightrec.toml":
            data = path.read_bytes()
            found[path.name] = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    return found


async def _rows(db: str) -> bytes:
    """Every row of every table as text, blobs as they are and gzip blobs decompressed."""
    tables = ("exchanges", "tags", "completions", "choices", "usage", "logprobs", "raw_streams")
    rows: list[Any] = []
    if db.startswith("sqlite"):
        with sqlite3.connect(make_url(db).database or "") as conn:
            for table in tables:
                rows += conn.execute(f"SELECT * FROM {table}").fetchall()
    else:
        conn = await asyncpg.connect(
            make_url(db).set(drivername="postgresql").render_as_string(False)
        )
        try:
            for table in tables:
                rows += await conn.fetch(f"SELECT * FROM {table}")
        finally:
            await conn.close()
    out = bytearray()
    for row in rows:
        for value in row:
            if isinstance(value, bytes | bytearray | memoryview):
                value = bytes(value)
                out += gzip.decompress(value) if value[:2] == b"\x1f\x8b" else value
            else:
                out += str(value).encode()
            out += b"\n"
    return bytes(out)


def _holding(outputs: dict[str, bytes]) -> dict[str, list[bytes]]:
    """Which needles each output holds (only those holding any)."""
    found = {name: [n for n in NEEDLES if n in data] for name, data in outputs.items()}
    return {name: needles for name, needles in found.items() if needles}


async def _run(
    tmp_path: Path, db: str, upstream: str, collector: Collector, rules: str
) -> dict[str, bytes]:
    """Everything the proxy wrote or sent about the exchanges, by where it was found."""
    config = _config(tmp_path, db, collector, rules)
    process, url = await _serve(tmp_path, config, upstream)
    outputs: dict[str, bytes] = {}
    try:
        await _exchanges(url)
        journal = tmp_path / "journal"
        for _ in range(400):  # the writer waits batch_interval (4 s): the journal holds them
            if journal.exists() and journal.read_bytes().count(b'"exchange"') == 2:
                break
            await asyncio.sleep(0.01)
        outputs |= {f"while journaled: {k}": v for k, v in _files(tmp_path).items()}
        assert b'"exchange"' in outputs["while journaled: journal"]
        for _ in range(1000):
            if (await _rows(db)).count(b"chatcmpl-") >= 2:
                break
            await asyncio.sleep(0.01)
        outputs |= {f"while written: {k}": v for k, v in _files(tmp_path).items()}
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    outputs |= {f"after stop: {k}": v for k, v in _files(tmp_path).items()}
    outputs["rows"] = await _rows(db)
    outputs["otlp"] = b"".join(collector.bodies)
    assert collector.bodies, "no spans received"
    outputs |= await _exports(tmp_path, config)
    return outputs


async def _exports(tmp_path: Path, config: Path) -> dict[str, bytes]:
    found = {}
    for fmt in ("jsonl", "csv", "har", "batch"):
        out = tmp_path / "exports" / f"export.{fmt}"
        out.parent.mkdir(exist_ok=True)
        run = await cli("export", "--config", str(config), "--format", fmt, "-o", str(out))
        assert run.code == 0, run.err
        found[f"export {fmt}"] = out.read_bytes()
    return found


@pytest.mark.parametrize("with_rules", [True, False], ids=["rules", "no-rules"])
async def test_no_output_holds_what_a_rule_matches(
    tmp_path: Path, db_url: str, upstream: str, collector: Collector, with_rules: bool
) -> None:
    outputs = await _run(tmp_path, db_url, upstream, collector, RULES if with_rules else "")
    found = _holding(outputs)
    if with_rules:
        assert found == {}
        assert ORDER.encode() in outputs["rows"]  # a Luhn-invalid digit run is not a card
        assert b"qs-secret-value" not in b"".join(outputs.values())
        # The stream's raw bytes and logprob tokens hold the secret split: neither is kept.
        assert PIECES[2].encode() not in b"".join(outputs.values())
        assert b'"rules":["api_key","card","email"]' in outputs["export jsonl"]
        assert b'"dropped":["raw_stream","logprobs"]' in outputs["export jsonl"]
        stream_id = orjson.loads(outputs["export jsonl"].splitlines()[1])["id"]
        shown = await cli("show", stream_id, "--config", str(tmp_path / "flightrec.toml"))
        assert "redacted     api_key, card, email; not kept: raw_stream, logprobs" in shown.out
        return
    # Without rules each kind of output holds them (so the test above can fail) ...
    for where in ("rows", "otlp", "export jsonl", "export csv", "export har", "export batch"):
        assert set(found.get(where, ())) == set(NEEDLES), where
    assert set(found["while journaled: journal"]) == set(NEEDLES)
    assert PIECES[2].encode() in outputs["rows"]  # in the raw stream and the logprob tokens
    if db_url.startswith("sqlite"):
        assert set(found["while written: flightrec.db-wal"]) == set(NEEDLES)
    # ... but secret-named query parameters are masked always.
    assert b"qs-secret-value" not in b"".join(outputs.values())
    # And the same records exported under the rules come out clean.
    clean = await _exports(tmp_path, _config(tmp_path, db_url, collector, RULES))
    assert _holding(clean) == {}
