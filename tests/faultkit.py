"""Real processes for the fault tests (`tests/test_faults.py`).

- `upstream_process()`: an OpenAI-like upstream in its own process (`python -m tests.faultkit
  upstream PORT`), answering chat completions streamed and not, so the test's event loop only
  runs the client side and its clock reads when a response really ended.
- `Serve`: `flightrec serve` as an operator runs it, from a TOML file, optionally without
  root's power to write anywhere (`UNPRIVILEGED`); killed or stopped by signal, restarted on
  the same files.
- `drive()`: a load generator sending requests at a fixed rate for a bounded time, noting for
  each its `X-Flightrec-Id` and the moment its response ended (`time.monotonic()`).
- `stored_ids()` / `wait_stored()`: the ids in the database, read directly (not through the
  proxy), polled with a deadline.
- `HealthProbe`: `/healthz` polled from a thread every 50 ms with a plain socket, so its
  latencies are the proxy's and not this process's event loop's; it also counts log lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg  # type: ignore[import-untyped]
import orjson
import pytest
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parents[1]


def held_port() -> socket.socket:
    """A socket bound to a port the system picked, not listening: the port stays ours until
    the socket closes, and a server binding with SO_REUSEADDR (aiohttp, so `flightrec serve`
    and the upstream here) takes it over. As tests/conftest.py `reserved_port`, for ports held
    across restarts."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if hasattr(socket, "SO_REUSEPORT"):  # for `serve --workers`, which shares the port
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def _wait_port(port: int, process: subprocess.Popen[bytes], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on port {port} after {seconds}s")


def stop_process(process: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds; always reaped."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


# --- The upstream ---


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {
        "id": "chatcmpl-fault",
        "object": "chat.completion.chunk",
        "created": 1_723_024_748,
        "model": "gpt-4o-mini-2024-07-18",
        "system_fingerprint": "fp_fault",
        "choices": [choice],
    }


USAGE = {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}
WORDS = ("Héllo", " wörld", " — 世界", " 🚀!")


def _stream_body(include_usage: bool) -> bytes:
    chunks = [_chunk({"role": "assistant", "content": ""})]
    chunks += [_chunk({"content": word}) for word in WORDS]
    chunks.append(_chunk({}, "stop"))
    if include_usage:
        chunks.append({**_chunk({}), "choices": [], "usage": USAGE})
    events = [b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks]
    return b"".join(events) + b"data: [DONE]\n\n"


COMPLETION = orjson.dumps(
    {
        "id": "chatcmpl-fault",
        "object": "chat.completion",
        "created": 1_723_024_748,
        "model": "gpt-4o-mini-2024-07-18",
        "system_fingerprint": "fp_fault",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "".join(WORDS), "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": USAGE,
    }
)


async def _serve_upstream(port: int) -> None:
    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        payload = orjson.loads(await request.read())
        if not payload.get("stream"):
            return web.Response(body=COMPLETION, content_type="application/json")
        include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        body = _stream_body(include_usage)
        half = len(body) // 2  # two writes: the proxy relays a stream in pieces
        await response.write(body[:half])
        await response.write(body[half:])
        await response.write_eof()
        return response

    app = web.Application(client_max_size=1 << 24)
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


UNREACHABLE = "postgresql+asyncpg://postgres@127.0.0.1:1/none"
"""Nothing listens on port 1: every connection is refused, as to a PostgreSQL that is down."""


@pytest.fixture
def upstream_fixture() -> Iterator[str]:
    """The upstream's base URL while its process runs, for one test."""
    with upstream_process() as url:
        yield url


@contextlib.contextmanager
def upstream_process() -> Iterator[str]:
    """The upstream's base URL (`http://127.0.0.1:PORT/v1`) while its process runs."""
    with held_port() as held:
        port = int(held.getsockname()[1])
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.faultkit", "upstream", str(port)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
        )
        try:
            _wait_port(port, process, 30)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            stop_process(process)


# --- The proxy ---


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return orjson.dumps(str(value)).decode()


@dataclass
class Serve:
    """`flightrec serve --config <workdir>/flightrec.toml`, its output in `<workdir>/serve.log`.

    `settings` are top-level config keys; `wrapper` is a command prefix such as `UNPRIVILEGED`.
    """

    workdir: Path
    upstream: str
    settings: dict[str, Any] = field(default_factory=dict)
    wrapper: tuple[str, ...] = ()
    held: socket.socket = field(default_factory=held_port, repr=False)
    """The port, held for every start and restart until `release()`."""
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def port(self) -> int:
        return int(self.held.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "serve.log"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def write_config(self) -> Path:
        lines = [f"{key} = {_toml_value(value)}" for key, value in self.settings.items()]
        lines += [f"port = {self.port}"]
        if "console_port" not in self.settings:
            lines += ["console_port = 0"]  # no console: parallel runs never share 8081
        lines += ["", "[[upstreams]]", 'name = "fake"']
        lines += [f"base_url = {_toml_value(self.upstream)}", 'prefix = "/v1"', ""]
        path = self.workdir / "flightrec.toml"
        path.write_text("\n".join(lines))
        path.chmod(0o644)
        return path

    def spawn(self) -> None:
        config = self.write_config()
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"--- start {self.starts} ---\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [*self.wrapper, sys.executable, "-m", "proxy", "serve", "--config", str(config)],
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: workers included in kill()
            )

    async def start(self, seconds: float = 30.0) -> None:
        """Start it and wait until `/healthz` answers (not `/readyz`: a fault may hold it 503)."""
        if not await self._started(seconds):
            raise AssertionError(f"serve did not start within {seconds}s:\n{self.log_text()}")

    async def _started(self, seconds: float) -> bool:
        self.spawn()
        assert self.process is not None
        deadline = time.monotonic() + seconds
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while time.monotonic() < deadline and self.process.poll() is None:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.get(self.url + "/healthz") as response:
                        if response.status == 200:
                            return True
                await asyncio.sleep(0.1)
        self.stop()
        return False

    def kill(self) -> float:
        """SIGKILL to serve and its workers (its process group); returns `time.monotonic()`
        just before the signal was sent."""
        assert self.process is not None
        at = time.monotonic()
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        return at

    def terminate(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)

    async def exited(self, seconds: float) -> int | None:
        """The exit code once it has exited, or None if it still runs after `seconds`."""
        assert self.process is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(self.process.wait, seconds)
        return self.process.poll()

    def stop(self) -> None:
        """SIGTERM, SIGKILL if it lingers, and SIGKILL to any worker left behind."""
        if self.process is not None:
            stop_process(self.process)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)

    def release(self) -> None:
        """Stop it for good and give its port back."""
        self.stop()
        self.held.close()

    async def readyz(self, path: str = "/readyz") -> tuple[int, str]:
        """`/readyz` (or the stricter `/readyz/db`): status and body."""
        timeout = aiohttp.ClientTimeout(total=2)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(self.url + path) as response,
        ):
            return response.status, await response.text()


def unprivileged() -> tuple[str, ...] | None:
    """A command prefix that runs a program without root's power to ignore file modes, so a
    directory without write permission truly refuses it (EACCES): nothing for a user that is
    not root, util-linux's `setpriv` dropping CAP_DAC_OVERRIDE for root; None without it.
    (Running as nobody instead would not do: the interpreter may live under a 0700 /root.)"""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return None
    caps = "-dac_override,-dac_read_search"
    return (setpriv, f"--inh-caps={caps}", f"--bounding-set={caps}")


def cannot_write(directory: Path, wrapper: tuple[str, ...]) -> str:
    """The error a program run with `wrapper` gets creating a file in `directory`; raises
    AssertionError if it can."""
    code = f"open({str(directory / 'probe')!r}, 'w')"
    probe = subprocess.run(
        [*wrapper, sys.executable, "-c", code], capture_output=True, text=True, timeout=30
    )
    assert probe.returncode != 0, f"{directory} is writable for {wrapper or 'us'}"
    return probe.stderr.strip().splitlines()[-1]


# --- The load ---


@dataclass
class Call:
    """One request of the load and what became of it."""

    n: int
    stream: bool
    sent: float
    ended: float | None = None
    """`time.monotonic()` when the whole response had arrived."""
    status: int | None = None
    id: str | None = None
    error: str | None = None

    @property
    def answered(self) -> bool:
        """A complete 200 answer reached the client: the exchange must be recorded."""
        return self.status == 200 and self.ended is not None


def _request_body(n: int, stream: bool, pad: int) -> bytes:
    content = f"fault probe {n} " + "x" * pad
    messages = [{"role": "user", "content": content}]
    return orjson.dumps({"model": "gpt-4o-mini", "messages": messages, "stream": stream})


async def _one(session: aiohttp.ClientSession, url: str, call: Call, pad: int) -> None:
    body = _request_body(call.n, call.stream, pad)
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-fault-probe"}
    try:
        async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
            call.id = r.headers.get("X-Flightrec-Id")
            data = await r.read()
            call.status = r.status
            complete = data.endswith(b"data: [DONE]\n\n") if call.stream else data.startswith(b"{")
            if complete:
                call.ended = time.monotonic()
            else:
                call.error = f"incomplete body ({len(data)} bytes)"
    except (aiohttp.ClientError, TimeoutError) as exc:
        call.error = f"{type(exc).__name__}: {exc}"


async def drive(
    url: str,
    *,
    rate: float,
    seconds: float,
    pad: int = 0,
    stop: asyncio.Event | None = None,
) -> list[Call]:
    """Send `rate` requests a second for `seconds` (or until `stop` is set), alternating
    streamed and plain ones; returns once every request has ended (each bounded to 15 s)."""
    calls: list[Call] = []
    tasks: list[asyncio.Task[None]] = []
    timeout = aiohttp.ClientTimeout(total=15)
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=timeout
    ) as session:
        start = time.monotonic()
        for n in range(int(rate * seconds)):
            delay = start + n / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if stop is not None and stop.is_set():
                break
            call = Call(n, stream=n % 2 == 0, sent=time.monotonic())
            calls.append(call)
            tasks.append(asyncio.create_task(_one(session, url, call, pad)))
        await asyncio.gather(*tasks)
    return calls


# --- The database, read directly ---


def direct_url(db_url: str, port: int) -> str:
    """`db_url` with its port replaced: the proxy's URL through a relay, from the direct one."""
    return make_url(db_url).set(port=port).render_as_string(hide_password=False)


async def stored_ids(db_url: str) -> set[str]:
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        return await asyncio.to_thread(_sqlite_ids, str(url.database))
    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        exists = await conn.fetchval("SELECT to_regclass('exchanges') IS NOT NULL")
        rows = await conn.fetch("SELECT id FROM exchanges") if exists else []
    finally:
        await conn.close()
    return {row["id"] for row in rows}


def _sqlite_ids(path: str) -> set[str]:
    if not Path(path).exists():
        return set()
    conn = sqlite3.connect(path, timeout=5)
    try:
        return {row[0] for row in conn.execute("SELECT id FROM exchanges")}
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return set()
        raise
    finally:
        conn.close()


async def wait_stored(db_url: str, want: set[str], seconds: float) -> set[str]:
    """The stored ids once all of `want` are among them, or whatever is stored after
    `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        stored = await stored_ids(db_url)
        if want <= stored or time.monotonic() > deadline:
            return stored
        await asyncio.sleep(0.25)


def due(calls: list[Call], ended_by: float | None = None) -> list[Call]:
    """The requests answered in full (by `ended_by`, if given): each must be recorded."""
    answered = [c for c in calls if c.answered]
    return [c for c in answered if ended_by is None or (c.ended or 0) <= ended_by]


def tally(calls: list[Call], stored: set[str], *, ended_by: float | None = None) -> dict[str, Any]:
    """Figures for a fault: of the requests that are `due`, how many are in the database."""
    answered = [c for c in calls if c.answered]
    owed = due(calls, ended_by)
    lost = [c.id for c in owed if c.id not in stored]
    late = [c for c in answered if c not in owed]
    return {
        "sent": len(calls),
        "answered": len(answered),
        "due": len(owed),
        "lost": len(lost),
        "lost_ids": lost[:5],
        "later_answered": len(late),
        "later_recorded": sum(c.id in stored for c in late),
    }


# --- Watching a proxy under a fault ---


class HealthProbe:
    """Polls `GET /healthz` every `every` seconds from a thread, noting each answer's latency
    (None for no answer within 2 s), and the lines the log gained since the probe started."""

    def __init__(self, port: int, log: Path, every: float = 0.05) -> None:
        self._port = port
        self._log = log
        self._every = every
        self._stop = threading.Event()
        self.latencies: list[float | None] = []
        self.log_lines: list[tuple[float, int]] = []
        self._read = self._log.stat().st_size if self._log.exists() else 0
        self._count = 0
        self._thread = threading.Thread(target=self._run, name="healthz-probe", daemon=True)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _get(self) -> float | None:
        conn = http.client.HTTPConnection("127.0.0.1", self._port, timeout=2)
        start = time.monotonic()
        try:
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            response.read()
            return time.monotonic() - start if response.status == 200 else None
        except OSError:
            return None
        finally:
            conn.close()

    def _lines(self) -> int:
        """Lines in the log so far, counting only what was added since the last look."""
        with contextlib.suppress(OSError), self._log.open("rb") as f:
            f.seek(self._read)
            added = f.read()
            self._read += len(added)
            self._count += added.count(b"\n")
        return self._count

    def _run(self) -> None:
        while not self._stop.is_set():
            self.latencies.append(self._get())
            self.log_lines.append((time.monotonic(), self._lines()))
            self._stop.wait(self._every)

    def worst_latency(self) -> float | None:
        """The slowest answer in seconds; None when some poll got no answer at all."""
        if not self.latencies or any(latency is None for latency in self.latencies):
            return None
        return max(latency for latency in self.latencies if latency is not None)

    def max_lines_per_second(self) -> float:
        """The most log lines a second over any window of at least a second between polls (a
        poll may wait 2 s for an answer, so windows are as long as polls are apart)."""
        worst = 0.0
        for i, (start, first) in enumerate(self.log_lines):
            later = [(t, c) for t, c in self.log_lines[i + 1 :] if t - start >= 1.0]
            if later:
                end, last = later[0]
                worst = max(worst, (last - first) / (end - start))
        return round(worst, 1)


if __name__ == "__main__" and sys.argv[1:2] == ["upstream"]:
    asyncio.run(_serve_upstream(int(sys.argv[2])))
