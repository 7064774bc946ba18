"""The command line as an operator meets it: a closed pipe, times with their zone, only the
config keys a command uses, the console port named when it is taken. Real processes
(`python -m proxy`), a real SQLite file."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import reserved_port
from tests.dbs import chat_exchange, recorded, sqlite_url

SIGPIPE_STATUS = 141
"""128 + SIGPIPE: what a shell reports for a writer killed by a closed pipe."""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}
    return env | extra


@pytest.fixture
async def many(tmp_path: Path) -> str:
    """A database holding more exchanges than a pipe's buffer holds as JSON."""
    url = sqlite_url(tmp_path / "many.db")
    await recorded(url, [chat_exchange(content="x" * 500) for _ in range(600)])
    return url


async def _first_line_then_close(url: str, *args: str) -> tuple[int, bytes, bytes]:
    """Run `flightrec ARGS | head -1`: read one line, close the pipe; (status, line, stderr)."""
    read_end, write_end = os.pipe()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", *args,
        env=_env(FLIGHTREC_DB_URL=url), stdout=write_end, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        line = await asyncio.to_thread(reader.readline)
    assert process.stderr is not None
    err = await asyncio.wait_for(process.stderr.read(), 60)
    return await asyncio.wait_for(process.wait(), 60), line, err


@pytest.mark.parametrize("args", [["logs", "--json", "--limit", "600"], ["export"]])
async def test_a_closed_pipe_ends_quietly(many: str, args: list[str]) -> None:
    code, line, err = await _first_line_then_close(many, *args)
    assert line
    assert err == b"", err
    assert code in (0, SIGPIPE_STATUS)  # click itself ends quietly, 0, on a closed stdout


async def _cli(*args: str, **env: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", *args,
        env=_env(**env), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_logs_and_show_print_utc_and_say_so(tmp_path: Path) -> None:
    """In Tokyo (UTC+9) `logs` and `show` print the time the console prints, labelled UTC."""
    url = sqlite_url(tmp_path / "t.db")
    exchange = chat_exchange(started_at=1_700_000_000.0)  # 2023-11-14 22:13:20 UTC
    await recorded(url, [exchange])
    code, out, err = await _cli("logs", FLIGHTREC_DB_URL=url, TZ="Asia/Tokyo")
    assert code == 0, err
    header, row = out.splitlines()
    assert header.startswith("STARTED (UTC)")
    assert row.startswith("2023-11-14 22:13:20  " + exchange.id)
    code, out, err = await _cli("show", exchange.id, FLIGHTREC_DB_URL=url, TZ="Asia/Tokyo")
    assert code == 0, err
    assert "2023-11-14 22:13:20 UTC" in out


async def test_a_command_checks_only_the_keys_it_uses(tmp_path: Path) -> None:
    """`logs` uses the database URL only: a bad port (or upstream, or price table) it never
    uses does not stop it; `serve` still says what is wrong with its own key, and an unknown
    key is an error for every command."""
    url = sqlite_url(tmp_path / "k.db")
    await recorded(url, [chat_exchange()])
    bad = {"FLIGHTREC_PORT": "abc", "FLIGHTREC_UPSTREAM": "nope", "FLIGHTREC_DB_URL": url}
    code, out, err = await _cli("logs", **bad)
    assert code == 0, err
    assert "STARTED" in out
    config = tmp_path / "c.toml"
    config.write_text('[prices."m"]\ninput = "free"\n')
    code, _, err = await _cli("logs", "--config", str(config), FLIGHTREC_DB_URL=url)
    assert code == 0, err
    code, _, err = await _cli("serve", **bad)
    assert (code, err.strip()) == (1, "Error: FLIGHTREC_PORT: expected an integer, got 'abc'")
    config.write_text("colour = 1\n")
    code, _, err = await _cli("logs", "--config", str(config), FLIGHTREC_DB_URL=url)
    assert code == 1 and "colour: unknown config key" in err


@contextlib.contextmanager
def _listening() -> Iterator[int]:
    """A port another process listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


async def test_serve_names_the_key_of_a_port_in_use(tmp_path: Path) -> None:
    """A second instance: the console's port (set by `serve --console-port`) or the proxy's
    port in use ends `serve` with one line naming the key and its flag."""
    url = sqlite_url(tmp_path / "p.db")
    env = {"FLIGHTREC_DB_URL": url, "FLIGHTREC_SPOOL_PATH": str(tmp_path / "spool")}
    with _listening() as taken, reserved_port() as free:
        args = ["serve", "--port", str(free), "--console-port", str(taken)]
        code, _, err = await _cli(*args, **env)
        assert code == 1
        assert "Traceback" not in err
        assert err.strip().splitlines()[-1] == (
            f"Error: console_port (--console-port; 0: no console): "
            f"http://127.0.0.1:{taken} is in use by another process"
        )
        code, _, err = await _cli("serve", "--port", str(taken), "--console-port", "0", **env)
        assert code == 1
        assert err.strip().splitlines()[-1] == (
            f"Error: port (--port): http://127.0.0.1:{taken} is in use by another process"
        )
