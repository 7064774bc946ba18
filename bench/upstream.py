"""The fast mock upstream: a bare asyncio Protocol speaking just enough HTTP/1.1 (keep-alive,
Content-Length request bodies, chunked responses) that it is never the bottleneck.

    python -m bench.upstream --port P

Serves, under any prefix:
- `POST .../chat/completions`: a realistic `chat.completion` (with `"logprobs": true`,
  `max_tokens` tokens each with its logprobs and `top_logprobs` alternatives), or with
  `"stream": true` an SSE
  stream of `chunks` OpenAI-shaped chunks then `data: [DONE]`, one chunk every `interval_ms`
  (0: all at once). With `stream_options.include_usage` the chunks carry `"usage": null` and a
  usage-only chunk comes last, as OpenAI does.
- `GET .../models`: a model list.
- `POST /__bench/stream {"chunks": N, "interval_ms": T}`: sets the stream shape for the
  requests that follow (the harness sets it before each measure; proxies in between, such as
  LiteLLM, rewrite requests, so the shape cannot travel with them).

Paced streams share one timer per interval instead of one sleep per chunk, so 1,000 streams
cost the mock one wake-up per tick.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from typing import Any

import orjson

MODEL = "gpt-4o-mini-2024-07-18"
HEAD = {
    "id": "chatcmpl-AUbenchmock0000000000000000",
    "object": "chat.completion.chunk",
    "created": 1731760000,
    "model": MODEL,
    "system_fingerprint": "fp_0ba0d124f1",
}
WORDS = [" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", "."]


def token_logprobs(tokens: int, top: int) -> dict[str, Any]:
    """A choice's `logprobs` as OpenAI gives them: each token with its bytes, its logprob and
    `top` alternatives."""

    def entry(i: int, rank: int) -> dict[str, Any]:
        word = WORDS[(i + rank) % len(WORDS)]
        return {
            "token": word,
            "logprob": -0.01 - 0.37 * rank - i / 1000,
            "bytes": list(word.encode()),
        }

    content = [
        {**entry(i, 0), "top_logprobs": [entry(i, r) for r in range(top)]} for i in range(tokens)
    ]
    return {"content": content, "refusal": None}


def completion_body(tokens: int = 40, top_logprobs: int | None = None) -> bytes:
    """A `chat.completion` of `tokens` tokens; with `top_logprobs`, its logprobs too."""
    content = "".join(WORDS[i % len(WORDS)] for i in range(tokens)).strip()
    logprobs = None if top_logprobs is None else token_logprobs(tokens, top_logprobs)
    return orjson.dumps(
        {
            "id": HEAD["id"],
            "object": "chat.completion",
            "created": HEAD["created"],
            "model": MODEL,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content, "refusal": None},
                    "logprobs": logprobs,
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": 25,
                "completion_tokens": tokens,
                "total_tokens": 25 + tokens,
                "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
            },
            "system_fingerprint": HEAD["system_fingerprint"],
        }
    )


def stream_events(chunks: int, usage: bool) -> list[bytes]:
    """`chunks` data events (role first, finish last), an optional usage event, then [DONE],
    each already framed as one HTTP chunk."""
    chunks = max(chunks, 2)
    extra: dict[str, Any] = {"usage": None} if usage else {}
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": "", "refusal": None}]
    deltas += [{"content": WORDS[i % len(WORDS)]} for i in range(max(chunks - 2, 0))]
    events = []
    for delta in deltas:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        events.append({**HEAD, **extra, "choices": [choice]})
    finish = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    events.append({**HEAD, **extra, "choices": [finish]})
    if usage:
        n = chunks - 2
        counts = {"prompt_tokens": 25, "completion_tokens": n, "total_tokens": 25 + n}
        events.append({**HEAD, "choices": [], "usage": counts})
    raw = [b"data: " + orjson.dumps(event) + b"\n\n" for event in events]
    raw.append(b"data: [DONE]\n\n")
    return [b"%x\r\n%s\r\n" % (len(data), data) for data in raw]


def completion_response(body: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b"x-request-id: req_bench\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )


COMPLETION = completion_body()
COMPLETION_RESPONSE = completion_response(COMPLETION)
WITH_LOGPROBS: dict[tuple[int, int], bytes] = {}
"""Responses with logprobs, made once for each (max_tokens, top_logprobs) asked for."""


def logprobs_response(payload: dict[str, Any]) -> bytes:
    """The response to a request that asks for logprobs: `max_tokens` tokens (40 without it),
    each with `top_logprobs` alternatives."""
    shape = (int(payload.get("max_tokens") or 40), int(payload.get("top_logprobs") or 0))
    if shape not in WITH_LOGPROBS:
        WITH_LOGPROBS[shape] = completion_response(completion_body(*shape))
    return WITH_LOGPROBS[shape]


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
    b"x-request-id: req_bench\r\nTransfer-Encoding: chunked\r\n\r\n"
)
MODELS = orjson.dumps(
    {"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model", "owned_by": "bench"}]}
)


def plain(status: str, body: bytes, content_type: bytes = b"application/json") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (
        status.encode(),
        content_type,
        len(body),
        body,
    )


class Settings:
    chunks = 20
    interval_ms = 0.0
    _events: dict[tuple[int, bool], list[bytes]] = {}  # noqa: RUF012 - a process-wide cache

    @classmethod
    def events(cls, usage: bool) -> list[bytes]:
        key = (cls.chunks, usage)
        if key not in cls._events:
            cls._events[key] = stream_events(cls.chunks, usage)
        return cls._events[key]


class Pacer:
    """Writes the next event of every open stream once per tick."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.streams: dict[MockProtocol, list[bytes]] = {}
        self._handle: asyncio.TimerHandle | None = None

    def add(self, protocol: MockProtocol, events: list[bytes]) -> None:
        self.streams[protocol] = events
        if self._handle is None:
            self._handle = asyncio.get_running_loop().call_later(self.interval, self._tick)

    def _tick(self) -> None:
        finished = []
        for protocol, events in self.streams.items():
            if protocol.transport is None or protocol.transport.is_closing():
                finished.append(protocol)
                continue
            protocol.transport.write(events.pop(0))
            if not events:
                finished.append(protocol)
        for protocol in finished:
            del self.streams[protocol]
            protocol.stream_done()
        self._handle = None
        if self.streams:
            self._handle = asyncio.get_running_loop().call_later(self.interval, self._tick)


PACERS: dict[float, Pacer] = {}


class MockProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.streaming = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.streaming:
            self.serve()

    def stream_done(self) -> None:
        self.streaming = False
        if self.buffer:
            self.serve()

    def serve(self) -> None:
        """Answer every complete request in the buffer (pipelined ones in order)."""
        while self.transport is not None and not self.streaming:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1")
            request_line, _, header_text = head.partition("\r\n")
            length = 0
            close = False
            for line in header_text.split("\r\n"):
                name, _, value = line.partition(":")
                lower = name.strip().lower()
                if lower == "content-length":
                    length = int(value)
                elif lower == "transfer-encoding":
                    self.transport.write(plain("411 Length Required", b"{}"))
                    self.transport.close()
                    return
                elif lower == "connection" and value.strip().lower() == "close":
                    close = True
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4 : end + 4 + length]
            self.buffer = self.buffer[end + 4 + length :]
            method, path = request_line.split(" ", 2)[:2]
            self.respond(method, path.split("?", 1)[0], body)
            if close and self.transport is not None:
                self.transport.close()

    def respond(self, method: str, path: str, body: bytes) -> None:
        assert self.transport is not None
        if path.endswith("/chat/completions") and method == "POST":
            payload = orjson.loads(body) if body else {}
            if payload.get("stream") is True:
                options = payload.get("stream_options") or {}
                self.stream(Settings.events(options.get("include_usage") is True))
            elif payload.get("logprobs") is True:
                self.transport.write(logprobs_response(payload))
            else:
                self.transport.write(COMPLETION_RESPONSE)
        elif path.endswith("/models") and method == "GET":
            self.transport.write(plain("200 OK", MODELS))
        elif path == "/__bench/stream" and method == "POST":
            shape = orjson.loads(body)
            Settings.chunks = int(shape.get("chunks", Settings.chunks))
            Settings.interval_ms = float(shape.get("interval_ms", Settings.interval_ms))
            self.transport.write(plain("200 OK", b"{}"))
        else:
            error = {"error": {"message": "not found", "type": "invalid_request_error"}}
            self.transport.write(plain("404 Not Found", orjson.dumps(error)))

    def stream(self, events: list[bytes]) -> None:
        assert self.transport is not None
        if Settings.interval_ms <= 0:
            self.transport.write(STREAM_HEAD + b"".join(events) + b"0\r\n\r\n")
            return
        self.transport.write(STREAM_HEAD + events[0])
        rest = [*events[1:-1], events[-1] + b"0\r\n\r\n"]
        interval = Settings.interval_ms / 1000
        pacer = PACERS.get(interval) or PACERS.setdefault(interval, Pacer(interval))
        self.streaming = True
        pacer.add(self, rest)


async def serve(host: str, port: int, reuse_port: bool = False) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        MockProtocol, host, port, backlog=4096, reuse_port=reuse_port or None
    )
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fast mock OpenAI upstream for the bench.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--reuse-port", action="store_true", help="share the port (SO_REUSEPORT)")
    parser.add_argument("--chunks", type=int, default=Settings.chunks, help="events a stream")
    parser.add_argument("--interval-ms", type=float, default=Settings.interval_ms)
    args = parser.parse_args(argv)
    # Set here for processes sharing a port: `/__bench/stream` reaches only one of them.
    Settings.chunks, Settings.interval_ms = args.chunks, args.interval_ms
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port, args.reuse_port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
