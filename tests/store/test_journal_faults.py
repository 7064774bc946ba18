"""The journal's disk refusing writes (a read-only directory, a full disk) while the database is
locked: the proxy keeps answering, logs little, says why it is not ready, and every record
reaches the database."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import pytest

from proxy.config import Config, Upstream
from proxy.relay.app import build_app, make_runner
from proxy.store import upgrade
from proxy.store.recorder import DatabaseRecorder
from tests.conftest import FakeUpstream, reserved_port, start_site
from tests.conftest import until as wait_until
from tests.dbs import chat_exchange, sqlite_url
from tests.store.test_recorder import SqliteLock, query

LOCK_SECONDS = 6.0
"""Longer than the SQLite writer's busy timeout (5 s): the database counts as unavailable."""
STAMP = re.compile(rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d{3} ")


@contextlib.contextmanager
def unwritable_dir(path: Path) -> Iterator[None]:
    """A directory that refuses writes to root too: a read-only bind mount (EROFS); for another
    user, chmod 555 (EACCES)."""
    path.mkdir()
    if os.geteuid() != 0:
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(0o755)
        return
    mount = ["mount", "--bind", "-o", "ro", str(path), str(path)]
    if subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("root without a read-only bind mount: cannot make a directory unwritable")
    try:
        with pytest.raises(OSError, match="Read-only file system"):
            (path / "probe").write_bytes(b"")
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


def lines_per_second(log: bytes) -> Counter[bytes]:
    """Log lines from the moment serve listens, by the second they were written in (a
    traceback's lines count with its first)."""
    counts: Counter[bytes] = Counter()
    second = b""
    for line in log[log.index(b"flightrec listening") :].splitlines():
        if (found := STAMP.match(line)) is not None:
            second = found.group(1)
        counts[second] += 1
    return counts


async def _healthz_times(session: aiohttp.ClientSession, url: str, until: float) -> list[float]:
    times: list[float] = []
    while time.monotonic() < until:
        began = time.monotonic()
        async with session.get(url + "/healthz", timeout=aiohttp.ClientTimeout(total=5)) as r:
            assert r.status == 200
        times.append(time.monotonic() - began)
        await asyncio.sleep(0.05)
    return times


async def _requests(session: aiohttp.ClientSession, url: str, until: float) -> int:
    sent = 0
    while time.monotonic() < until:
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200
            await response.read()
        sent += 1
        await asyncio.sleep(0.05)
    return sent


def _count(db: Path) -> int:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return int(conn.execute("SELECT count(*) FROM exchanges").fetchone()[0])


async def test_an_unwritable_journal_directory_and_a_locked_database_never_stall_serve(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    db = tmp_path / "serve.db"
    await upgrade(sqlite_url(db))
    env = {**os.environ, "FLIGHTREC_SPOOL_PATH": str(tmp_path / "ro" / "sp" / "fr.spool")}
    env["FLIGHTREC_CONSOLE_PORT"] = "0"  # no console: parallel runs never share 8081
    log_path = tmp_path / "serve.log"
    with reserved_port() as port, unwritable_dir(tmp_path / "ro"), log_path.open("wb") as log:
        url = f"http://127.0.0.1:{port}"
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", "serve", "--port", str(port),
            "--upstream", upstream.url, "--db", sqlite_url(db),
            env=env, stdout=log, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        try:
            async with aiohttp.ClientSession() as session:
                await _wait_listening(session, url, process)
                async with session.get(url + "/readyz") as response:
                    assert response.status == 503
                    assert "not writable" in (await response.json())["reason"]
                locked_at = time.monotonic()
                with SqliteLock(sqlite_url(db)):
                    until = time.monotonic() + LOCK_SECONDS
                    times, sent = await asyncio.gather(
                        _healthz_times(session, url, until), _requests(session, url, until)
                    )
                await wait_until(lambda: _count(db) == sent, within=20)
                window = time.monotonic() - locked_at
        finally:
            process.terminate()
            await asyncio.wait_for(process.wait(), 30)
    assert sent > 20
    assert max(times) < 0.1, sorted(times)[-5:]
    counts = lines_per_second(log_path.read_bytes())
    assert max(counts.values()) < 10, counts
    assert sum(counts.values()) < 10 * window


async def _wait_listening(
    session: aiohttp.ClientSession, url: str, process: asyncio.subprocess.Process
) -> None:
    deadline = time.monotonic() + 30
    while True:
        with contextlib.suppress(aiohttp.ClientConnectionError):
            async with session.get(url + "/healthz") as response:
                if response.status == 200:
                    return
        assert process.returncode is None, "serve exited"
        assert time.monotonic() < deadline, "serve did not start"
        await asyncio.sleep(0.1)


async def test_readyz_says_why_it_is_not_ready_while_healthz_stays_up(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    db = sqlite_url(tmp_path / "flightrec.db")
    await upgrade(db)
    config = replace(
        Config(),
        upstreams=(Upstream("openai", upstream.url, "/v1"),),
        db_url=db,
        spool_path=str(tmp_path / "records.spool"),
        batch_interval=0.01,
    )
    recorder = DatabaseRecorder(config, busy_timeout_ms=50)
    recorder.retry_min = recorder.retry_max = 0.05
    runner = make_runner(build_app(config, recorder), config)
    await runner.setup()
    url = await start_site(runner)
    try:
        async with aiohttp.ClientSession() as session:

            async def readyz(path: str = "/readyz/db") -> tuple[int, dict[str, str]]:
                async with session.get(url + path) as response:
                    return response.status, await response.json()

            assert await readyz() == (200, {"status": "ready", "database": "up"})
            with SqliteLock(db):
                body = {"model": "gpt-4o-mini", "messages": []}
                async with session.post(url + "/v1/chat/completions", json=body) as response:
                    assert response.status == 200
                deadline = time.monotonic() + 10
                while (answer := await readyz())[0] == 200:
                    assert time.monotonic() < deadline, "readyz/db stayed 200, database locked"
                    await asyncio.sleep(0.02)
                assert answer[0] == 503
                assert answer[1]["status"] == "not ready"
                assert answer[1]["reason"].startswith("database unavailable: OperationalError")
                # The journal keeps the records: the proxy itself stays ready.
                assert (await readyz("/readyz"))[0] == 200
                async with session.get(url + "/healthz") as response:
                    assert response.status == 200
            deadline = time.monotonic() + 10
            while (answer := await readyz())[0] != 200:
                assert time.monotonic() < deadline, "readyz/db did not recover"
                await asyncio.sleep(0.02)
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[None]:
    """A tmpfs of `size` at `path`: writes past it fail with ENOSPC."""
    path.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)]
    if subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here: no small disk to fill")
    try:
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


async def test_a_full_disk_keeps_records_in_memory_and_the_database_gets_them(
    tmp_path: Path,
) -> None:
    db = sqlite_url(tmp_path / "flightrec.db")
    await upgrade(db)
    with small_disk(tmp_path / "disk", "64k"):
        config = replace(
            Config(),
            db_url=db,
            spool_path=str(tmp_path / "disk" / "records.spool"),
            batch_interval=0.01,
        )
        sent = [chat_exchange() for _ in range(100)]  # ~170 KB: more than the disk holds
        with SqliteLock(db):
            recorder = DatabaseRecorder(config, busy_timeout_ms=20)
            recorder.retry_min = recorder.retry_max = 0.05
            await recorder.start()
            for ex in sent:
                recorder.accept(ex)
                await asyncio.sleep(0.001)
            await wait_until(lambda: "No space left" in (recorder.readiness() or ""))
            # Only whole records are in the journal: a write cut short by the full disk is undone.
            whole = (tmp_path / "disk" / "records.spool").read_bytes()
            assert whole.endswith(b"\n")
        await recorder.stop()
    assert recorder.losses.in_memory_total > 0 and recorder.losses.lost_total == 0
    stored = await query(db, "SELECT id FROM exchanges")
    assert sorted(row[0] for row in stored) == sorted(ex.id for ex in sent)
