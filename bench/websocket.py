"""WebSocket relaying: flightrec beside a bare aiohttp WebSocket relay, in one run.

    python -m bench.websocket                 # latency, CPU, then the concurrency run
    python -m bench.websocket --quick
    python -m bench.websocket --sessions 1000 --rate 20 --seconds 30

Processes: a mock upstream speaking Realtime-shaped events (`upstream` below), the bare relay
(`relay` below: aiohttp's WebSocket server and client, two pumps, nothing parsed or
recorded: the floor), and `flightrec serve` recording into SQLite. The client is this
process. Every client frame gets one frame back, so a session is a series of round trips;
each 20 client frames make one Realtime response (`response.create`, 18 audio appends of
50 ms answered by audio deltas, then `response.done` with usage), which flightrec records.

- latency: one session, round trips one at a time, the targets alternating in rounds; the
  added latency per frame is a target's p50 round trip less the direct one's, in the same
  round.
- cpu: 8 sessions doing round trips as fast as they can; the target's CPU time (its process,
  from /proc) per frame relayed (both directions), and flightrec's as a ratio to the relay's.
- concurrency: `--sessions` sessions, each sending `--rate` frames a second for `--seconds`;
  errors, frames per second achieved, the round trip's p50/p99, and the target's memory per
  open session (RSS with them open less RSS before, over the number of sessions).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import WSMsgType, web

from . import procs

AUDIO = base64.b64encode(bytes(range(240)) * 10).decode()
"""50 ms of 24 kHz 16-bit mono, as a Realtime client appends it."""
ANSWER_WITHIN = 10.0
"""Seconds a paced round trip may take before the session counts as failed."""
CYCLE = 20
"""Client frames per Realtime response."""
USAGE = {
    "total_tokens": 60,
    "input_tokens": 40,
    "output_tokens": 20,
    "input_token_details": {"text_tokens": 10, "audio_tokens": 30, "cached_tokens": 0},
    "output_token_details": {"text_tokens": 5, "audio_tokens": 15},
}


def client_frame(n: int) -> str:
    """The `n`th frame a session's client sends."""
    step = n % CYCLE
    if step == 0:
        return json.dumps({"type": "response.create", "response": {"instructions": "go"}})
    if step == CYCLE - 1:
        return json.dumps({"type": "response.cancel"})
    return json.dumps({"type": "input_audio_buffer.append", "audio": AUDIO})


async def _upstream_session(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(protocols=("realtime",), max_msg_size=0, compress=False)
    await ws.prepare(request)
    responses = 0
    rid = "resp_0"
    async for msg in ws:
        event = json.loads(msg.data)
        kind = event["type"]
        if kind == "response.create":
            responses += 1
            rid = f"resp_{responses}"
            reply: dict[str, Any] = {"type": "response.created", "response": {"id": rid}}
        elif kind == "response.cancel":
            done = {"id": rid, "status": "completed", "output": [], "usage": USAGE}
            reply = {"type": "response.done", "response": done}
        else:
            reply = {
                "type": "response.output_audio.delta",
                "response_id": rid,
                "item_id": "item_1",
                "output_index": 0,
                "content_index": 0,
                "delta": event.get("audio", ""),
            }
        await ws.send_str(json.dumps(reply))
    return ws


async def _serve(app: web.Application, port: int) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def upstream_app() -> web.Application:
    app = web.Application()
    app.router.add_get("/v1/realtime", _upstream_session)
    app.router.add_get("/v1/models", _healthz)
    return app


async def _pump(source: Any, sink: Any) -> None:
    async for msg in source:
        if msg.type is WSMsgType.TEXT:
            await sink.send_frame(msg.data, WSMsgType.TEXT)
        elif msg.type is WSMsgType.BINARY:
            await sink.send_bytes(msg.data)
    await sink.close()


def relay_app(upstream: str) -> web.Application:
    """The floor: a WebSocket relay with aiohttp and nothing else."""
    client = web.AppKey("client", aiohttp.ClientSession)

    async def relay(request: web.Request) -> web.WebSocketResponse:
        up = await request.app[client].ws_connect(
            upstream + request.path_qs[len("/v1") :], max_msg_size=0, decode_text=False
        )
        ws = web.WebSocketResponse(
            protocols=(up.protocol,) if up.protocol else (),
            compress=False,
            max_msg_size=0,
            decode_text=False,
        )
        await ws.prepare(request)
        await asyncio.gather(_pump(ws, up), _pump(up, ws))
        return ws

    async def session(app: web.Application) -> Any:
        app[client] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        yield
        await app[client].close()

    app = web.Application()
    app.cleanup_ctx.append(session)
    app.router.add_get("/v1/models", _healthz)
    app.router.add_get("/{tail:.*}", relay)
    return app


def flightrec(upstream: str, workdir: Path) -> procs.Target:
    port = procs.free_port()
    config = workdir / "flightrec.toml"
    config.write_text(
        f'port = {port}\nconsole_port = 0\nlog_level = "warning"\n'
        f'db_url = "sqlite+aiosqlite:///{workdir / "flightrec.db"}"\n'
        f'spool_path = "{workdir / "flightrec.spool"}"\n'
        f'[[upstreams]]\nname = "mock"\nbase_url = "{upstream}"\nprefix = "/v1"\n'
    )
    argv = [sys.executable, "-m", "proxy", "serve", "--config", str(config)]
    return procs.Target(
        "flightrec",
        "flightrec serve, SQLite",
        argv,
        port,
        cwd=str(procs.ROOT),
        ready_path="/healthz",
    )


def _child(name: str, *args: str) -> procs.Target:
    port = procs.free_port()
    argv = [sys.executable, "-m", "bench.websocket", name, "--port", str(port), *args]
    return procs.Target(name, name, argv, port, cwd=str(procs.ROOT))


async def round_trips(url: str, count: int, start: int = 0) -> list[float]:
    """One session's `count` round trips, one at a time: seconds each."""
    times = []
    async with aiohttp.ClientSession() as http, http.ws_connect(url, max_msg_size=0) as ws:
        for n in range(start, start + count):
            began = time.perf_counter()
            await ws.send_str(client_frame(n))
            msg = await ws.receive()
            if msg.type is not WSMsgType.TEXT:
                raise RuntimeError(f"round trip {n}: {msg.type}")
            times.append(time.perf_counter() - began)
    return times


async def paced(url: str, rate: float, seconds: float, times: list[float]) -> int:
    """One session sending `rate` frames a second for `seconds`; returns its errors."""
    errors = 0
    try:
        async with aiohttp.ClientSession() as http, http.ws_connect(url, max_msg_size=0) as ws:
            begin = time.perf_counter()
            n = 0
            while (now := time.perf_counter()) - begin < seconds:
                await asyncio.sleep(max(0.0, begin + n / rate - now))
                sent = time.perf_counter()
                await ws.send_str(client_frame(n))
                msg = await ws.receive(timeout=ANSWER_WITHIN)
                if msg.type is not WSMsgType.TEXT:
                    return errors + 1
                times.append(time.perf_counter() - sent)
                n += 1
    except (aiohttp.ClientError, OSError, TimeoutError):
        errors += 1
    return errors


def _ws(target: procs.Target) -> str:
    return f"http://127.0.0.1:{target.port}/v1/realtime?model=gpt-realtime"


async def measure_latency(targets: list[procs.Target], rounds: int, count: int) -> dict[str, Any]:
    p50: dict[str, list[float]] = {t.name: [] for t in targets}
    for _ in range(rounds):
        for target in targets:
            times = await round_trips(_ws(target), count)
            p50[target.name].append(statistics.median(times) * 1000)
    direct = p50["upstream"]
    out: dict[str, Any] = {"round_trip_p50_ms": {k: statistics.median(v) for k, v in p50.items()}}
    out["added_p50_ms"] = {
        name: statistics.median(a - d for a, d in zip(values, direct, strict=True))
        for name, values in p50.items()
        if name != "upstream"
    }
    return out


async def measure_cpu(targets: list[procs.Target], sessions: int, each: int) -> dict[str, Any]:
    per_frame: dict[str, float] = {}
    for target in targets:
        if target.name == "upstream":
            continue
        before = procs.cpu_seconds(target.pids)
        await asyncio.gather(*(round_trips(_ws(target), each) for _ in range(sessions)))
        used = procs.cpu_seconds(target.pids) - before
        per_frame[target.name] = used / (2 * sessions * each) * 1e6
    out: dict[str, Any] = {"cpu_us_per_frame": per_frame}
    if "relay" in per_frame and "flightrec" in per_frame:
        out["flightrec_to_relay"] = per_frame["flightrec"] / per_frame["relay"]
    return out


async def load(url: str, sessions: int, rate: float, seconds: float) -> dict[str, Any]:
    """`sessions` paced sessions from this process: errors and round-trip times."""
    times: list[float] = []
    tasks = []
    for _ in range(sessions):  # opened over a second, as a fleet of clients would
        tasks.append(asyncio.ensure_future(paced(url, rate, seconds, times)))
        await asyncio.sleep(1 / sessions)
    errors = sum(await asyncio.gather(*tasks))
    return {"errors": errors, "times": times}


async def measure_concurrency(
    target: procs.Target, sessions: int, rate: float, seconds: float, clients: int
) -> dict[str, Any]:
    """`sessions` sessions from `clients` processes (one process cannot send them all)."""
    rss_before = procs.rss_kib(target.pids)
    cpu_before = procs.cpu_seconds(target.pids)
    share = [sessions // clients + (i < sessions % clients) for i in range(clients)]
    argv = [sys.executable, "-m", "bench.websocket", "load", "--upstream", _ws(target)]
    argv += ["--rate", str(rate), "--seconds", str(seconds)]
    children = [
        await asyncio.create_subprocess_exec(
            *argv, "--sessions", str(n), stdout=asyncio.subprocess.PIPE, cwd=procs.ROOT
        )
        for n in share
    ]
    await asyncio.sleep(1 + seconds / 2)
    rss_open = procs.rss_kib(target.pids)
    errors, times = 0, []
    for child in children:
        out, _ = await child.communicate()
        got = json.loads(out)
        errors += got["errors"]
        times += got["times"]
    cpu = procs.cpu_seconds(target.pids) - cpu_before
    times.sort()
    return {
        "target": target.name,
        "sessions": sessions,
        "client_processes": clients,
        "rate_per_session": rate,
        "seconds": seconds,
        "errors": errors,
        "round_trips": len(times),
        "round_trips_per_s": len(times) / seconds,
        "p50_ms": times[len(times) // 2] * 1000 if times else None,
        "p99_ms": times[int(len(times) * 0.99)] * 1000 if times else None,
        "rss_kib_per_session": (rss_open - rss_before) / sessions,
        "cpu_us_per_frame": cpu / max(1, 2 * len(times)) * 1e6,
        "cpu_busy": cpu / seconds,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-ws-"))
    upstream = _child("upstream")
    procs.start(upstream, workdir)
    procs.wait_ready(upstream)
    base = f"http://127.0.0.1:{upstream.port}/v1"
    relay = _child("relay", "--upstream", base.replace("http", "ws"))
    record = flightrec(base, workdir)
    targets = [upstream, relay, record]
    results: dict[str, Any] = {}
    try:
        for target in (relay, record):
            procs.start(target, workdir)
            procs.wait_ready(target)
        if not args.concurrency_only:
            count = 300 if args.quick else 2000
            results["latency"] = await measure_latency(targets, 3 if args.quick else 5, count)
            each = 500 if args.quick else 2500
            results["cpu"] = await measure_cpu(targets, 8, each)
        runs = results["concurrency"] = []
        for round_ in range(args.rounds):  # alternating, so a busy spell hits both alike
            for target in (relay, record) if round_ % 2 == 0 else (record, relay):
                runs.append(
                    await measure_concurrency(
                        target, args.sessions, args.rate, args.seconds, args.clients
                    )
                )
    finally:
        for target in reversed(targets):
            procs.stop(target)
    with contextlib.closing(sqlite3.connect(workdir / "flightrec.db")) as db:
        results["flightrec_responses_recorded"] = db.execute(
            "SELECT count(*) FROM exchanges WHERE usage_source = 'reported'"
        ).fetchone()[0]
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.websocket")
    parser.add_argument("role", nargs="?", choices=("upstream", "relay", "load"))
    parser.add_argument("--port", type=int)
    parser.add_argument("--upstream")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=1, help="client processes")
    parser.add_argument("--concurrency-only", action="store_true")
    parser.add_argument("--rounds", type=int, default=1, help="concurrency runs per target")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "websocket.json")
    args = parser.parse_args(argv)
    if args.role == "upstream":
        asyncio.run(_serve(upstream_app(), args.port))
    elif args.role == "load":
        print(json.dumps(asyncio.run(load(args.upstream, args.sessions, args.rate, args.seconds))))
    elif args.role == "relay":
        asyncio.run(_serve(relay_app(args.upstream), args.port))
    else:
        results = asyncio.run(run(args))
        args.out.write_text(json.dumps(results, indent=2) + "\n")
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
