"""A fake OpenAI Batch API (files and batches) as a real aiohttp app, shaped as the openai SDK's
types say (`openai.types.FileObject`, `openai.types.Batch`, the batch output line of the
Batch API guide: `{"id": "batch_req_...", "custom_id", "response": {"status_code",
"request_id", "body"}, "error"}`), and the figures the tests expect of it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from .conftest import start_site

MODEL = "gpt-5-2025-08-07"
CREATED = 1_795_000_000  # 2026-11-18 11:06 UTC, when the results were made (batch rates are
# dated from 2026-10-14 in genai-prices 0.2.3)


def request_line(custom_id: str, content: str) -> dict[str, Any]:
    body = {"model": "gpt-5", "messages": [{"role": "user", "content": content}]}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


INPUT_LINES = [request_line(f"r{n}", f"question {n}") for n in range(1, 5)]
INPUT = b"\n".join(orjson.dumps(line) for line in INPUT_LINES) + b"\n"


def _answer(n: int, usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-b{n}",
        "object": "chat.completion",
        "created": CREATED + n,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"answer {n}", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": usage,
        "system_fingerprint": None,
    }


USAGE_1 = {"prompt_tokens": 1_000_000, "completion_tokens": 1_000_000, "total_tokens": 2_000_000}
USAGE_2 = {
    "prompt_tokens": 2_000,
    "completion_tokens": 300,
    "total_tokens": 2_300,
    "prompt_tokens_details": {"cached_tokens": 1_000},
    "completion_tokens_details": {"reasoning_tokens": 100},
}
COST_1 = 5.625
"""gpt-5 at batch rates ($0.625 in, $5 out per 1M, half the standard $1.25 / $10)."""
COST_2 = 0.0021875
"""1000 uncached in at $0.625, 1000 cached at $0.0625, 300 out at $5, per 1M."""


def output_lines(count: int, usage: dict[str, Any]) -> bytes:
    """An output file of `count` successful results, each with `usage`."""
    return b"".join(
        _line(n, {"status_code": 200, "request_id": f"req_b{n}", "body": _answer(n, usage)}) + b"\n"
        for n in range(1, count + 1)
    )


def _line(n: int, response: dict[str, Any] | None, error: Any = None) -> bytes:
    line = {"id": f"batch_req_{n:04d}", "custom_id": f"r{n}", "response": response, "error": error}
    return orjson.dumps(line)


OUTPUT = (
    _line(1, {"status_code": 200, "request_id": "req_b1", "body": _answer(1, USAGE_1)})
    + b"\n"
    + _line(2, {"status_code": 200, "request_id": "req_b2", "body": _answer(2, USAGE_2)})
    + b"\n"
)
_BAD_REQUEST = {
    "error": {
        "message": "Invalid value for 'messages'.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": None,
    }
}
_EXPIRED = {
    "code": "batch_expired",
    "message": "This request could not be executed before the completion window expired.",
}
ERRORS = (
    _line(3, {"status_code": 400, "request_id": "req_b3", "body": _BAD_REQUEST})
    + b"\n"
    + _line(4, None, _EXPIRED)
    + b"\n"
)


@dataclass
class FakeBatches:
    """Files and batches kept in memory; a batch is completed the first time it is retrieved."""

    files: dict[str, bytes] = field(default_factory=dict)
    batches: dict[str, dict[str, Any]] = field(default_factory=dict)
    output: bytes = OUTPUT
    """The output file of every batch."""
    url: str = ""

    async def upload(self, request: web.Request) -> web.Response:
        form = await request.post()
        upload = form["file"]
        assert isinstance(upload, web.FileField) and form["purpose"] == "batch"
        content = upload.file.read()
        file_id = f"file-in{len(self.files) + 1}"
        self.files[file_id] = content
        return web.json_response(self._file(file_id, len(content), upload.filename, "batch"))

    @staticmethod
    def _file(file_id: str, size: int, name: str, purpose: str) -> dict[str, Any]:
        return {
            "id": file_id,
            "object": "file",
            "bytes": size,
            "created_at": int(time.time()),
            "filename": name,
            "purpose": purpose,
            "status": "processed",
        }

    async def create(self, request: web.Request) -> web.Response:
        asked = await request.json()
        batch = {
            "id": f"batch_{len(self.batches) + 1:04d}",
            "object": "batch",
            "endpoint": asked["endpoint"],
            "input_file_id": asked["input_file_id"],
            "completion_window": asked["completion_window"],
            "status": "validating",
            "created_at": CREATED - 3600,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": asked.get("metadata"),
        }
        self.batches[batch["id"]] = batch
        return web.json_response(batch)

    async def retrieve(self, request: web.Request) -> web.Response:
        batch = self.batches[request.match_info["id"]]
        number = batch["id"].removeprefix("batch_")
        self.files[f"file-out{number}"] = self.output
        self.files[f"file-err{number}"] = ERRORS
        batch |= {
            "status": "expired",
            "output_file_id": f"file-out{number}",
            "error_file_id": f"file-err{number}",
            "expired_at": CREATED + 60,
            "request_counts": {"total": 4, "completed": 2, "failed": 2},
        }
        return web.json_response(batch)

    async def content(self, request: web.Request) -> web.Response:
        data = self.files[request.match_info["id"]]
        return web.Response(body=data, content_type="application/octet-stream")

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/files", self.upload)
        app.router.add_post("/v1/batches", self.create)
        app.router.add_get("/v1/batches/{id}", self.retrieve)
        app.router.add_get("/v1/files/{id}/content", self.content)
        return app


@asynccontextmanager
async def fake_batches() -> AsyncIterator[FakeBatches]:
    fake = FakeBatches()
    runner = web.AppRunner(fake.app(), access_log=None)
    await runner.setup()
    try:
        fake.url = await start_site(runner) + "/v1"
        yield fake
    finally:
        await runner.cleanup()
