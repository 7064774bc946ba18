"""How long one large exchange's redaction holds other requests up (`proxy/sinks/fanout.py`).

    python -m bench.redact_stall [--body pem|image] [--on-loop] [--rounds 3]

The real proxy (in this process, a memory recorder, an upstream answering a small completion)
with the four presets on; a client sends small requests back to back while one request with
a large body goes through: `pem`, about 1 MB of `-----BEGIN PRIVATE KEY-----` lines (the
`api_key` preset's worst case), or `image`, an 8 MB base64 image in a data URL. Prints the
small requests' median and worst latency during each round and the time the large exchange
took to reach the recorder. `--on-loop` runs `Keep` on the event loop as before the worker.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import time
from dataclasses import replace

import aiohttp
import orjson
from aiohttp import web

from proxy.config import Config, Upstream
from proxy.privacy.redact import PRESETS, parse_rules
from proxy.relay.app import build_app, make_runner
from proxy.relay.appkeys import APP_SINKS
from proxy.sinks.fanout import MemoryRecorder

ANSWER = orjson.dumps(
    {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
)


async def answer(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=ANSWER, content_type="application/json")


def large(kind: str) -> bytes:
    if kind == "pem":
        content: object = "-----BEGIN PRIVATE KEY-----\n" * (1_000_000 // 28)
    else:
        image = base64.b64encode(os.urandom(6_000_000)).decode()
        url = f"data:image/png;base64,{image}"
        content = [{"type": "image_url", "image_url": {"url": url}}]
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": content}]})


async def round_(url: str, session: aiohttp.ClientSession, body: bytes, rec: MemoryRecorder) -> str:
    small = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    latencies: list[float] = []
    done = asyncio.Event()

    async def smalls() -> None:
        while not done.is_set() and len(latencies) < 100_000:
            began = time.perf_counter()
            async with session.post(url, data=small) as response:
                await response.read()
            latencies.append(time.perf_counter() - began)

    task = asyncio.create_task(smalls())
    await asyncio.sleep(0.2)
    count, began = len(rec.exchanges), time.perf_counter()
    async with session.post(url, data=body) as response:
        await response.read()
    for _ in range(600):  # until the large exchange is recorded (at most 60 s)
        if any(len(ex.request_body or b"") > 100_000 for ex in rec.exchanges[count:]):
            break
        await asyncio.sleep(0.1)
    kept = time.perf_counter() - began
    await asyncio.sleep(0.2)
    done.set()
    await task
    median = statistics.median(latencies) * 1000
    worst = max(latencies) * 1000
    return (
        f"small requests: median {median:.1f} ms, worst {worst:.0f} ms; large kept in {kept:.2f} s"
    )


async def main(kind: str, on_loop: bool, rounds: int) -> None:
    upstream_app = web.Application(client_max_size=1 << 30)
    upstream_app.router.add_post("/v1/chat/completions", answer)
    upstream = web.AppRunner(upstream_app, access_log=None)
    await upstream.setup()
    site = web.TCPSite(upstream, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    rules = parse_rules([{"preset": name} for name in PRESETS], ValueError)
    config = replace(
        Config(),
        upstreams=(Upstream("openai", f"http://127.0.0.1:{port}/v1", "/v1"),),
        redact=rules,
        max_request_bytes=1 << 30,
    )
    recorder = MemoryRecorder()
    app = build_app(config, recorder)
    if on_loop:
        app[APP_SINKS]._worker = None  # as before: Keep in accept, on the loop
    runner = make_runner(app, config)
    await runner.setup()
    proxy = web.TCPSite(runner, "127.0.0.1", 0)
    await proxy.start()
    proxy_port = proxy._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{proxy_port}/v1/chat/completions"
    body = large(kind)
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(rounds):
                print(await round_(url, session, body, recorder))
    finally:
        await runner.cleanup()
        await upstream.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--body", choices=("pem", "image"), default="pem")
    parser.add_argument("--on-loop", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.body, args.on_loop, args.rounds))
