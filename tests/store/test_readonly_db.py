"""A SQLite database flightrec cannot write, or whose log it cannot keep short: `serve`
refuses a read-only database at start with one line; failing checkpoints and a log that keeps
growing are warnings, once when they start and then at most once a minute.

`serve` runs as root without the capability to override file permissions (`setpriv
--bounding-set`), so a file's mode bites as it does for any other user: plain root writes a
0444 file regardless.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from proxy.store import sqlite_writer, upgrade, wal
from proxy.store.rows import rows_for
from proxy.store.sqlite_writer import SqliteWriter
from tests.conftest import FakeUpstream, reserved_port
from tests.dbs import chat_exchange, sqlite_url

UNPRIVILEGED = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--"]


@pytest.fixture(scope="module")
def unprivileged() -> list[str]:
    """The command prefix; skips unless it really makes a 0444 file unwritable."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    with tempfile.TemporaryDirectory() as where:
        probe = Path(where) / "probe"
        probe.touch(mode=0o444)
        tried = subprocess.run([*UNPRIVILEGED, "sh", "-c", f"echo x >> {probe}"], check=False)
    if tried.returncode == 0:
        pytest.skip("setpriv cannot drop the permission override here")
    return UNPRIVILEGED


@pytest.fixture
def port() -> Iterator[int]:
    """A port held for the `serve` the test starts."""
    with reserved_port() as held:
        yield held


async def _serve(
    prefix: list[str], tmp_path: Path, db: Path, upstream: str, port: int
) -> tuple[asyncio.subprocess.Process, str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")},
        "FLIGHTREC_SPOOL_PATH": str(tmp_path / "spool" / "fr.spool"),
        "FLIGHTREC_LOG_LEVEL": "info",
        "FLIGHTREC_CONSOLE_PORT": "0",  # no console: parallel runs never share 8081
    }
    (tmp_path / "spool").mkdir(exist_ok=True)
    with (tmp_path / "serve.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            *prefix, sys.executable, "-m", "proxy", "serve", "--port", str(port),
            "--upstream", upstream, "--db", sqlite_url(db),
            env=env, stdout=log, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    return process, f"http://127.0.0.1:{port}"


def _log(tmp_path: Path) -> str:
    return (tmp_path / "serve.log").read_text()


@pytest.mark.parametrize("read_only", ["file", "directory"])
async def test_serve_refuses_a_database_it_cannot_write(
    unprivileged: list[str], tmp_path: Path, upstream: FakeUpstream, read_only: str, port: int
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    db = data / "flightrec.db"
    await upgrade(sqlite_url(db))  # an existing, migrated database, closed cleanly (no -wal)
    (db if read_only == "file" else data).chmod(0o444 if read_only == "file" else 0o555)
    process, _ = await _serve(unprivileged, tmp_path, db, upstream.url, port)
    try:
        code = await asyncio.wait_for(process.wait(), 60)
    finally:
        if process.returncode is None:
            process.kill()
        data.chmod(0o755)
        db.chmod(0o600)
    output = _log(tmp_path)
    assert code == 1, output
    assert "Traceback" not in output
    assert output.strip().splitlines() == [
        f"Error: cannot write the SQLite database {db} (OperationalError: attempt to write a "
        "readonly database): the file and its directory must be writable by the user "
        "flightrec runs as"
    ]
    assert "listening" not in output


@pytest.fixture
async def db_path(tmp_path: Path) -> AsyncIterator[Path]:
    path = tmp_path / "flightrec.db"
    await upgrade(sqlite_url(path))
    yield path


async def test_a_log_a_reader_keeps_growing_is_reported_once_a_minute(
    db_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Sizes and pace scaled down so a few batches show it: a warning past 1 MB, a checkpoint
    # after every batch.
    monkeypatch.setattr(wal, "WAL_WARN_BYTES", 1_000_000)
    monkeypatch.setattr(sqlite_writer, "CHECKPOINT_EVERY", 0.0)
    caplog.set_level(logging.INFO, logger="proxy.store.wal")
    reader = sqlite3.connect(db_path, isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM exchanges").fetchone()  # holds its snapshot
    writer = SqliteWriter(str(db_path), busy_timeout_ms=1000)
    try:
        for _ in range(20):
            await writer.write([rows_for(chat_exchange(logprobs=["x"] * 200)) for _ in range(20)])
            if writer._checkpointing is not None:
                await writer._checkpointing
        assert os.stat(f"{db_path}-wal").st_size > 3_000_000  # grew well past the warning
    finally:
        reader.close()
        await writer.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"the SQLite log {db_path}-wal has grown to")


def _chattr(path: Path, flag: str) -> bool:
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


async def test_a_database_made_immutable_under_serve_is_a_warning_not_a_flood(
    tmp_path: Path, upstream: FakeUpstream, port: int
) -> None:
    """`chattr +i` stops writes even through the file descriptors SQLite already holds (plain
    chmod does not: SQLite reuses the descriptor it opened before), so the checkpoint fails
    while the log keeps taking records, as the issue saw."""
    db, probe = tmp_path / "flightrec.db", tmp_path / "probe"
    probe.touch()
    if not shutil.which("chattr") or not (_chattr(probe, "+i") and _chattr(probe, "-i")):
        pytest.skip("chattr +i does not work here (filesystem or privileges)")
    process, url = await _serve([], tmp_path, db, upstream.url, port)
    sent = 0
    try:
        async with aiohttp.ClientSession() as session:
            await _wait_for(lambda: "listening" in _log(tmp_path), process)
            sent += await _traffic(session, url, _after(1.0))
            assert _chattr(db, "+i")
            sent += await _traffic(session, url, lambda: "WARNING" in _log(tmp_path))
            sent += await _traffic(session, url, _after(3.0))  # three checkpoints or more
            warnings = [line for line in _log(tmp_path).splitlines() if "WARNING" in line]
            assert len(warnings) == 1, warnings
            assert f"WAL checkpoint of {db} failing (OperationalError: " in warnings[0]
            assert f"its log {db}-wal holds" in warnings[0]
            assert _chattr(db, "-i")
            sent += await _traffic(session, url, lambda: "works again" in _log(tmp_path))
    finally:
        _chattr(db, "-i")
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 60)
    assert code == 0, _log(tmp_path)
    with contextlib.closing(sqlite3.connect(db)) as con:
        assert con.execute("SELECT count(*) FROM exchanges").fetchone() == (sent,)


async def test_serve_on_a_file_that_is_no_database_says_that_not_read_only(
    tmp_path: Path, upstream: FakeUpstream, port: int
) -> None:
    db = tmp_path / "notes.db"
    db.write_text("not a database, but a text file someone named .db\n" * 10)
    process, _ = await _serve([], tmp_path, db, upstream.url, port)
    try:
        code = await asyncio.wait_for(process.wait(), 60)
    finally:
        if process.returncode is None:
            process.kill()
    errors = [line for line in _log(tmp_path).splitlines() if line.startswith("Error")]
    assert code == 1 and errors == [
        f"Error: cannot connect to the database at {sqlite_url(db)}: DatabaseError: file is not "
        "a database"
    ]


async def _traffic(session: aiohttp.ClientSession, url: str, until: Callable[[], bool]) -> int:
    """Requests one after another until `until()`, at most 30 s; returns how many there were."""
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    sent = 0
    deadline = time.monotonic() + 30
    while not until():
        assert time.monotonic() < deadline, "condition not met in 30 s"
        async with session.post(url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200
            sent += 1
        await asyncio.sleep(0.05)
    return sent


async def _wait_for(condition: Callable[[], bool], process: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert process.returncode is None and time.monotonic() < deadline, "serve did not start"
        await asyncio.sleep(0.05)


def _after(seconds: float) -> Callable[[], bool]:
    end = time.monotonic() + seconds
    return lambda: time.monotonic() >= end
