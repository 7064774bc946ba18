"""The load generator: a lean HTTP/1.1 keep-alive client on raw asyncio streams, in its own
process so its cost never lands on a target.

    python -m bench.load   # a worker: one JSON command per line on stdin, one result per line

Commands (`op`):
- `closed`: `concurrency` connections each send requests back to back (with `logprobs`: that
  many tokens asked for with their logprobs), `warmup` requests
  first (not measured), then `requests` of them or until `seconds` pass. Latency per request
  with perf_counter_ns; for streams also the time to the first body byte (TTFB). With `raw`,
  the result also lists every latency.
- `paired`: one connection to each of several `ports`; each cycle sends one request to each,
  in a fresh random order, `warmup` cycles first, then `requests` cycles or until `seconds`
  pass. One result per port, in the order given. With `pids`, the measured cycles start once
  those processes are quiet after the warm-up. Every target is measured at the same moments,
  so a slow spell of a noisy machine falls on all of them alike (rounds of one target after
  another moved a target's c=1 figures by 0.1 ms from one round to the next).
- `rate`: open loop at a fixed `rate` for `seconds`; latency counts from when the request was
  due, not when it was sent, so a stalled target cannot hide its queue (coordinated omission).
- `streams`: `count` streams at once (opened over `ramp` seconds), each read to its end,
  sampling the targets' RSS meanwhile.

Every command may name `pids`: the target's processes, whose CPU time is read before and after
the measured phase (after the target goes quiet, so background work such as the recorder's
writes is counted) and whose RSS is reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from .procs import cpu_seconds, rss_kib

REQUEST_BODY: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
        {"role": "user", "content": "Name three things a logging proxy should never slow down."},
    ],
    "temperature": 0.2,
    "max_tokens": 128,
}


def request_bytes(
    port: int, path: str, stream: bool, prompt_bytes: int = 0, logprobs: int = 0
) -> bytes:
    """The bench's request; `prompt_bytes` more of prompt in a last user message; with
    `logprobs`, that many tokens asked for with their logprobs, 5 alternatives each."""
    payload: dict[str, Any] = {**REQUEST_BODY, "stream": stream}
    if logprobs:
        payload.update(logprobs=True, top_logprobs=5, max_tokens=logprobs)
    if prompt_bytes:
        words = "word " * (prompt_bytes // 5)
        payload["messages"] = [*REQUEST_BODY["messages"], {"role": "user", "content": words}]
    body = orjson.dumps(payload)
    return (
        b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"Accept: application/json\r\nAuthorization: Bearer sk-bench-0123456789abcdef\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (path.encode(), port, len(body), body)
    )


class ProtocolError(Exception):
    pass


@dataclass(slots=True)
class Reply:
    status: int
    latency_ns: int
    ttfb_ns: int | None = None
    events: int = 0
    complete: bool = True
    """For streams: the body ended with `data: [DONE]`."""


class Connection:
    """One keep-alive connection; requests go one at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.usable = True

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        return cls(reader, writer)

    def close(self) -> None:
        self.usable = False
        self.writer.close()

    async def send(self, raw: bytes, started_ns: int, stream: bool) -> Reply:
        self.writer.write(raw)
        reader = self.reader
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length: int | None = None
        chunked = False
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection" and value.strip().lower() == b"close":
                self.usable = False
        ttfb: int | None = None
        events = 0
        tail = b""
        if chunked:
            while True:
                size = int(await reader.readuntil(b"\r\n"), 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                data = (await reader.readexactly(size + 2))[:-2]
                if ttfb is None:
                    ttfb = time.perf_counter_ns() - started_ns
                joined = tail + data
                events += joined.count(b"\n\n") - tail.count(b"\n\n")
                tail = joined[-16:]
        elif length is not None:
            data = await reader.readexactly(length)
            ttfb = time.perf_counter_ns() - started_ns
            tail = data[-16:]
            events = data.count(b"\n\n")
        else:
            data = await reader.read()
            self.usable = False
            tail = data[-16:]
            events = data.count(b"\n\n")
        latency = time.perf_counter_ns() - started_ns
        complete = not stream or tail.rstrip().endswith(b"data: [DONE]")
        return Reply(status, latency, ttfb, events, complete)


@dataclass
class Tally:
    latencies: list[int] = field(default_factory=list)
    ttfbs: list[int] = field(default_factory=list)
    events: list[int] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)

    def add(self, reply: Reply, stream: bool) -> None:
        if reply.status != 200:
            self.errors[f"HTTP {reply.status}"] += 1
        elif not reply.complete:
            self.errors["stream without [DONE]"] += 1
        else:
            self.latencies.append(reply.latency_ns)
            if stream and reply.ttfb_ns is not None:
                self.ttfbs.append(reply.ttfb_ns)
            self.events.append(reply.events)

    def error(self, exc: BaseException) -> None:
        self.errors[type(exc).__name__] += 1

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ok": len(self.latencies),
            "errors": sum(self.errors.values()),
            "error_kinds": dict(self.errors.most_common(5)),
        }
        for name, values in (("latency", self.latencies), ("ttfb", self.ttfbs)):
            if values:
                values.sort()
                out[f"{name}_p50_ms"] = percentile(values, 50) / 1e6
                out[f"{name}_p99_ms"] = percentile(values, 99) / 1e6
                out[f"{name}_mean_ms"] = sum(values) / len(values) / 1e6
                out[f"{name}_max_ms"] = values[-1] / 1e6
        if self.events:
            self.events.sort()
            out["events_min"] = self.events[0]
            out["events_p50"] = percentile(self.events, 50)
        return out


def percentile(sorted_values: list[int], p: float) -> int:
    """Nearest-rank percentile of an already sorted list."""
    rank = max(1, -(-len(sorted_values) * p // 100))
    return sorted_values[int(rank) - 1]


async def settled_cpu(pids: list[int], quiet: float = 0.2, limit: float = 5.0) -> float:
    """The targets' CPU time once they have stopped using any for `quiet` seconds."""
    if not pids:
        return 0.0
    deadline = time.monotonic() + limit
    last = cpu_seconds(pids)
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet)
        now = cpu_seconds(pids)
        if now == last:
            break
        last = now
    return last


async def _one(
    conns: list[Connection | None],
    index: int,
    port: int,
    raw: bytes,
    stream: bool,
    tally: Tally | None,
) -> None:
    """One request on `conns[index]` (opened first if there is none or the last one closed
    it), tallied; a refused connection is an error of this target alone."""
    conn = conns[index]
    try:
        if conn is None or not conn.usable:
            conn = conns[index] = await Connection.open(port)
        reply = await conn.send(raw, time.perf_counter_ns(), stream)
    except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
        if conn is not None:
            conn.close()
        if tally is not None:
            tally.error(exc)
        return
    if tally is not None:
        tally.add(reply, stream)


async def closed_loop(cmd: dict[str, Any]) -> dict[str, Any]:
    port, stream, pids = cmd["port"], bool(cmd.get("stream")), cmd.get("pids", [])
    prompt, logprobs = int(cmd.get("prompt_bytes", 0)), int(cmd.get("logprobs", 0))
    raw = request_bytes(port, cmd["path"], stream, prompt, logprobs)
    concurrency = int(cmd["concurrency"])
    gap = float(cmd.get("gap_ms", 0)) / 1000
    conns: list[Connection | None] = []

    async def phase(total: int, seconds: float, tally: Tally | None) -> None:
        remaining = total
        deadline = time.perf_counter() + seconds

        async def worker(index: int) -> None:
            nonlocal remaining
            while remaining > 0 and time.perf_counter() < deadline:
                remaining -= 1
                await _one(conns, index, port, raw, stream, tally)
                if gap:
                    await asyncio.sleep(gap)

        await asyncio.gather(*(worker(i) for i in range(concurrency)))

    try:
        conns.extend(await asyncio.gather(*(Connection.open(port) for _ in range(concurrency))))
        await phase(int(cmd.get("warmup", 0)), float(cmd["seconds"]), None)
        tally = Tally()
        cpu_before = await settled_cpu(pids)
        started = time.perf_counter()
        await phase(int(cmd["requests"]), float(cmd["seconds"]), tally)
        elapsed = time.perf_counter() - started
        cpu = await settled_cpu(pids) - cpu_before
    finally:
        for conn in conns:
            if conn is not None:
                conn.close()
    out = tally.summary()
    out.update(elapsed_s=elapsed, rps=out["ok"] / elapsed if elapsed else 0.0)
    if pids:
        out.update(cpu_s=cpu, rss_kib=rss_kib(pids))
    if cmd.get("raw"):  # every latency, for a caller merging several runs' percentiles
        out["latencies_ns"] = tally.latencies
    return out


async def paired_loop(cmd: dict[str, Any]) -> dict[str, Any]:
    ports = [int(port) for port in cmd["ports"]]
    stream = bool(cmd.get("stream"))
    raws = [request_bytes(port, cmd["path"], stream) for port in ports]
    rng = random.Random(cmd.get("seed", 0))
    gap = float(cmd.get("gap_ms", 0)) / 1000
    conns: list[Connection | None] = [None] * len(ports)  # opened by the first request

    async def cycles(total: int, seconds: float, tallies: list[Tally] | None) -> None:
        deadline = time.perf_counter() + seconds
        order = list(range(len(ports)))
        for _ in range(total):
            if time.perf_counter() >= deadline:
                break
            rng.shuffle(order)
            for i in order:
                tally = None if tallies is None else tallies[i]
                await _one(conns, i, ports[i], raws[i], stream, tally)
                if gap:
                    await asyncio.sleep(gap)

    try:
        await cycles(int(cmd.get("warmup", 0)), float(cmd["seconds"]), None)
        await settled_cpu(cmd.get("pids", []))  # the warm-up's background work done
        tallies = [Tally() for _ in ports]
        started = time.perf_counter()
        await cycles(int(cmd["requests"]), float(cmd["seconds"]), tallies)
        elapsed = time.perf_counter() - started
    finally:
        for conn in conns:
            if conn is not None:
                conn.close()
    results = []
    for tally in tallies:
        out = tally.summary()
        out.update(elapsed_s=elapsed, rps=out["ok"] / elapsed if elapsed else 0.0)
        results.append(out)
    return {"results": results}


class Pool:
    """Idle keep-alive connections to one port, grown on demand up to `limit`."""

    def __init__(self, port: int, limit: int) -> None:
        self.port = port
        self.limit = limit
        self.idle: list[Connection] = []
        self.total = 0

    async def get(self) -> Connection:
        while self.idle:
            conn = self.idle.pop()
            if conn.usable:
                return conn
            self.total -= 1
        if self.total >= self.limit:
            raise ProtocolError("connection limit reached")
        self.total += 1
        try:
            return await Connection.open(self.port)
        except BaseException:
            self.total -= 1
            raise

    def put(self, conn: Connection) -> None:
        if conn.usable:
            self.idle.append(conn)
        else:
            self.total -= 1

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()
        self.total = 0


async def open_loop(cmd: dict[str, Any]) -> dict[str, Any]:
    port, pids = cmd["port"], cmd.get("pids", [])
    raw = request_bytes(port, cmd["path"], False)
    rate, seconds = float(cmd["rate"]), float(cmd["seconds"])
    pool = Pool(port, int(cmd.get("max_connections", 512)))
    # Connections are opened before the clock starts: their set-up is not what is measured.
    warm = [await pool.get() for _ in range(min(64, max(4, int(rate / 100))))]
    for conn in warm:
        pool.put(conn)
    tally = Tally()
    total = max(1, int(rate * seconds))

    async def one(due_ns: int) -> None:
        conn: Connection | None = None
        try:
            conn = await pool.get()
            reply = await conn.send(raw, due_ns, False)
        except (OSError, asyncio.IncompleteReadError, ValueError, ProtocolError) as exc:
            if conn is not None:
                conn.close()
            tally.error(exc)
        else:
            reply.latency_ns = time.perf_counter_ns() - due_ns
            tally.add(reply, False)
        finally:
            if conn is not None:
                pool.put(conn)

    cpu_before = await settled_cpu(pids)
    tasks: list[asyncio.Task[None]] = []
    start_ns = time.perf_counter_ns() + 1_000_000
    step_ns = 1e9 / rate
    sent = 0
    while sent < total:
        now = time.perf_counter_ns()
        due = min(total, int((now - start_ns) / step_ns) + 1)
        while sent < due:
            tasks.append(asyncio.create_task(one(start_ns + int(sent * step_ns))))
            sent += 1
        await asyncio.sleep(max(0.0, (start_ns + sent * step_ns - time.perf_counter_ns()) / 1e9))
    _, late = await asyncio.wait(tasks, timeout=float(cmd.get("grace", 2.0)))
    for task in late:
        task.cancel()
        tally.errors["no reply within grace"] += 1
    elapsed = (time.perf_counter_ns() - start_ns) / 1e9
    cpu = await settled_cpu(pids) - cpu_before
    pool.close()
    out = tally.summary()
    out.update(rate=rate, sent=sent, elapsed_s=elapsed, connections=pool.limit)
    if pids:
        out.update(cpu_s=cpu)
    return out


async def many_streams(cmd: dict[str, Any]) -> dict[str, Any]:
    port, pids = cmd["port"], cmd.get("pids", [])
    raw = request_bytes(port, cmd["path"], True)
    count, ramp = int(cmd["count"]), float(cmd.get("ramp", 1.0))
    tally = Tally()
    open_now = 0
    most_open = 0

    async def one(delay: float) -> None:
        nonlocal open_now, most_open
        await asyncio.sleep(delay)
        conn: Connection | None = None
        open_now += 1
        most_open = max(most_open, open_now)
        try:
            conn = await Connection.open(port)
            tally.add(await conn.send(raw, time.perf_counter_ns(), True), True)
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            tally.error(exc)
        finally:
            open_now -= 1
            if conn is not None:
                conn.close()

    rss_before = rss_kib(pids) if pids else 0
    cpu_before = await settled_cpu(pids)
    rss_peak = rss_before
    started = time.perf_counter()
    tasks = [asyncio.create_task(one(ramp * i / count)) for i in range(count)]
    waiting = asyncio.gather(*tasks)
    deadline = started + float(cmd.get("timeout", 120.0))
    while not waiting.done() and time.perf_counter() < deadline:
        if pids:
            rss_peak = max(rss_peak, rss_kib(pids))
        await asyncio.wait([waiting], timeout=0.1)
    if not waiting.done():
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        tally.errors["timed out"] += sum(1 for task in tasks if task.cancelled())
    elapsed = time.perf_counter() - started
    cpu = await settled_cpu(pids) - cpu_before
    out = tally.summary()
    out.update(count=count, most_open=most_open, elapsed_s=elapsed)
    if pids:
        out.update(cpu_s=cpu, rss_before_kib=rss_before, rss_peak_kib=rss_peak)
    return out


OPS: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "closed": closed_loop,
    "paired": paired_loop,
    "rate": open_loop,
    "streams": many_streams,
}


async def serve_commands() -> None:
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        cmd = orjson.loads(line)
        try:
            result = await OPS[cmd["op"]](cmd)
        except Exception as exc:  # report it to the harness, keep serving
            result = {"failed": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(orjson.dumps(result).decode() + "\n")
        sys.stdout.flush()


def main() -> int:
    asyncio.run(serve_commands())
    return 0


if __name__ == "__main__":
    sys.exit(main())
