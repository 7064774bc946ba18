"""Targets as child processes: start them on free ports, wait until they answer, stop them, and
read what they cost the machine from /proc.

A target is anything the load generator can send OpenAI-shaped requests to. CPU is the process
tree's own time (utime + stime of the target and every live descendant, plus what reaped
children left in cutime + cstime), so multi-process targets (nginx workers, uvicorn) are counted
whole. RSS is VmRSS summed over the same tree.

`python -m bench.procs flightrec-memory --port P --upstream URL --count-file F` runs flightrec
through `proxy.serve.run` with an in-memory recorder that only counts what it is given: the
"recording cost" baseline (everything flightrec does except writing to a database).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
"""The repository: where `python -m bench.upstream` runs."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024


def pythonpath(*first: str | Path) -> str:
    """PYTHONPATH for a child running the checkout(s) `first`: they come first, then the path
    inherited, which may be where the dependencies are (`pip install --target DIR`, no
    virtualenv), made absolute: children run in other directories."""
    inherited = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return os.pathsep.join([str(p) for p in first] + [os.path.abspath(p) for p in inherited if p])


def checkout_module(checkout: str | Path, path: str, name: str) -> ModuleType:
    """The file `path` of another checkout, loaded as module `name` beside this checkout's
    modules: only that file is the other checkout's, what it imports comes from this one (for
    an A/B of one module in one process)."""
    spec = importlib.util.spec_from_file_location(name, Path(checkout) / path)
    if spec is None or spec.loader is None or not (Path(checkout) / path).is_file():
        raise SystemExit(f"{checkout}: no {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: split after the last ")".
    return raw[raw.rindex(")") + 2 :].split()


def process_tree(roots: list[int]) -> list[int]:
    """The roots and all their live descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    todo = list(roots)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def cpu_seconds(roots: list[int]) -> float:
    """CPU time (user + system) used so far by the process trees under `roots`."""
    ticks = 0
    for pid in process_tree(roots):
        fields = _stat_fields(pid)
        if fields is not None:
            # Fields 14-17 of /proc/<pid>/stat: utime, stime, cutime, cstime.
            ticks += sum(int(value) for value in fields[11:15])
    return ticks / CLOCK_TICKS


def own_cpu_seconds(pid: int) -> float:
    """CPU time used so far by `pid` itself (0 once it is gone)."""
    fields = _stat_fields(pid)
    return sum(int(value) for value in fields[11:13]) / CLOCK_TICKS if fields else 0.0


def rss_kib(roots: list[int]) -> int:
    """Resident memory of the process trees under `roots`, in KiB."""
    total = 0
    for pid in process_tree(roots):
        try:
            statm = Path(f"/proc/{pid}/statm").read_text().split()
        except OSError:
            continue
        total += int(statm[1]) * PAGE_KIB
    return total


RecordCounter = Callable[[], dict[str, int]]
"""Counts of what a recording target has recorded so far: total, ok, ok_streams."""


@dataclass
class Target:
    name: str
    about: str
    argv: list[str] = field(default_factory=list)
    port: int = 0
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    ready_path: str = "/v1/models"
    ready_timeout: float = 30.0
    record_counter: RecordCounter | None = None
    """How to ask a recording target what it has recorded; None for targets that do not."""
    skipped: str | None = None
    """Why the target is not measured (peers that cannot be installed here)."""
    cleanup: Callable[[], None] | None = None
    process: subprocess.Popen[bytes] | None = None
    log_path: str | None = None
    log_dir: Path | None = None
    crashes: list[int] = field(default_factory=list)
    """Exit statuses of the times it died during the bench and was started again."""

    @property
    def pids(self) -> list[int]:
        return [self.process.pid] if self.process is not None else []


def mock_upstream() -> Target:
    """The bench's mock OpenAI upstream (`bench.upstream`) on a free port."""
    port = free_port()
    argv = [sys.executable, "-m", "bench.upstream", "--port", str(port)]
    return Target("upstream", "mock upstream", argv, port, cwd=str(ROOT))


def start(target: Target, log_dir: Path) -> None:
    """Start the target's process; its output goes to a log file in `log_dir`."""
    if not target.argv:
        return
    target.log_dir = log_dir
    suffix = f".{len(target.crashes)}" if target.crashes else ""  # keep the log of a crash
    target.log_path = str(log_dir / f"{target.name}{suffix}.log")
    log: IO[bytes] = open(target.log_path, "wb")  # noqa: SIM115 - the child owns it
    with log:
        target.process = subprocess.Popen(
            target.argv,
            env={**os.environ, **target.env},
            cwd=target.cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_ready(target: Target) -> None:
    """Wait until the target answers `ready_path` with a status below 500; raises otherwise."""
    deadline = time.monotonic() + target.ready_timeout
    url = f"http://127.0.0.1:{target.port}{target.ready_path}"
    last = "no answer"
    while time.monotonic() < deadline:
        if target.process is not None and target.process.poll() is not None:
            raise RuntimeError(f"{target.name} exited with {target.process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status < 500:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                return
            last = f"HTTP {exc.code}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.1)
    raise RuntimeError(f"{target.name} not ready after {target.ready_timeout:.0f}s: {last}")


def listening(port: int) -> int:
    """Sockets listening on `port` (IPv4 and IPv6): with SO_REUSEPORT, one a process."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            next(rows, None)  # the header
            for row in rows:
                fields = row.split()
                # local address "ADDR:PORT" (hex), state 0A: LISTEN
                if fields[3] == "0A" and int(fields[1].rpartition(":")[2], 16) == port:
                    count += 1
    return count


def wait_listening(
    port: int, count: int, targets: Sequence[Target] = (), timeout: float = 60.0
) -> None:
    """Wait until `count` processes listen on `port`, raising if one of `targets` exits first.
    A server of N processes answers once its first one listens; connections opened before the
    others do all go to the first ones and stay there (keep-alive), so a measure started then
    loads only some of them."""
    deadline = time.monotonic() + timeout
    while (found := listening(port)) < count:
        for target in targets:
            if target.process is not None and target.process.poll() is not None:
                raise RuntimeError(f"{target.name} exited with {target.process.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{found} of {count} listening on {port} after {timeout:.1f}s")
        time.sleep(0.05)


def stop(target: Target, grace: float = 10.0) -> None:
    """SIGTERM the target's process group, then SIGKILL it if it is still there after `grace`."""
    process = target.process
    if process is not None and process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
    if target.cleanup is not None:
        target.cleanup()
        target.cleanup = None


def read_counts(path: Path) -> dict[str, int]:
    """The counts a `flightrec-memory` launcher last wrote."""
    import json

    try:
        counts: dict[str, int] = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"total": 0, "ok": 0, "ok_streams": 0}
    return counts


PUBLISH = 0.2
"""Seconds between two writes of a `flightrec-memory` target's counts while exchanges come."""
SETTLE_PUBLISH = 1.0
"""Seconds before counts not written yet (no exchange came since) are."""


def _launch_flightrec_memory(port: int, upstream: str, count_file: Path) -> None:
    import orjson

    from proxy.config import Config, Upstream
    from proxy.exchange import Exchange
    from proxy.sinks.fanout import MemoryRecorder

    tmp, final = str(count_file.with_suffix(".tmp")), str(count_file)

    class CountingRecorder(MemoryRecorder):
        """A MemoryRecorder that keeps counts, not exchanges, so a long bench does not grow
        the heap with records and skew the RSS figures.

        The counts reach `count_file` within `PUBLISH` seconds while exchanges come (written
        from `accept`, no task woken for it) and within `SETTLE_PUBLISH` once they stop: a
        task woken five times a second, and a file written through a `Path` each time, cost
        ~700k instructions a second, which `bench.count` counted as flightrec's own."""

        def __init__(self) -> None:
            super().__init__()
            self.counts = {"total": 0, "ok": 0, "ok_streams": 0}
            self._task: asyncio.Task[None] | None = None
            self._due = 0.0
            self._written: dict[str, int] = {}

        async def start(self) -> None:
            self._write()
            self._task = asyncio.create_task(self._publish())

        def accept(self, exchange: Exchange) -> None:
            counts = self.counts
            counts["total"] += 1
            if exchange.outcome == "ok":
                counts["ok"] += 1
                counts["ok_streams"] += exchange.stream
            if time.monotonic() >= self._due:
                self._write()

        async def stop(self) -> None:
            if self._task is not None:
                self._task.cancel()
            self._write()

        def _write(self) -> None:
            self._due = time.monotonic() + PUBLISH
            self._written = dict(self.counts)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, orjson.dumps(self._written))
            finally:
                os.close(fd)
            os.replace(tmp, final)

        async def _publish(self) -> None:
            while True:
                await asyncio.sleep(SETTLE_PUBLISH)
                if self.counts != self._written:
                    self._write()

    from proxy.serve import run

    upstreams = (Upstream("openai", upstream, "/v1"),)
    config = Config(port=port, console_port=0, upstreams=upstreams)  # no database: no console
    asyncio.run(run(config, CountingRecorder()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Launch flightrec with an in-memory recorder.")
    parser.add_argument("what", choices=["flightrec-memory"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--count-file", type=Path, required=True)
    args = parser.parse_args(argv)
    _launch_flightrec_memory(args.port, args.upstream, args.count_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
