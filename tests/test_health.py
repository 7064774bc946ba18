"""`flightrec health` (`proxy/health.py`) as a container's HEALTHCHECK runs it: a real process
reading the same config as a real `flightrec serve` on a port that is not the default."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest
from aiohttp import web

from tests.conftest import reserved_port, start_site, wait_until_up


async def _health(*args: str, env: Mapping[str, str] = {}) -> tuple[int, str, str]:
    """Run `flightrec health ARGS` with `env` over a clean environment: exit status, stdout,
    stderr."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", "health", *args,
        env={**clean, **env}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.fixture
async def serving_on_all_addresses(tmp_path: Path) -> AsyncIterator[tuple[int, Path]]:
    """`flightrec serve` from a config file that has it listen on 0.0.0.0 and a free port;
    the port and the file."""
    with reserved_port() as port:
        config = tmp_path / "flightrec.toml"
        config.write_text(
            f'host = "0.0.0.0"\nport = {port}\nconsole_port = 0\n'
            f'db_url = "sqlite+aiosqlite:///{tmp_path / "serve.db"}"\n'
            f'spool_path = "{tmp_path / "spool"}"\n'
        )
        log = (tmp_path / "serve.log").open("wb")
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", "serve", "--config", str(config),
            stdout=log, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        await wait_until_up(f"http://127.0.0.1:{port}/readyz", process)
    try:
        yield port, config
    finally:
        process.terminate()
        await process.wait()


async def test_health_asks_the_port_serve_was_configured_with(
    serving_on_all_addresses: tuple[int, Path],
) -> None:
    port, config = serving_on_all_addresses
    healthz = f"ok: http://127.0.0.1:{port}/healthz 200 ok\n"
    # The config file (0.0.0.0 is asked on loopback), FLIGHTREC_PORT, and the flag.
    assert await _health("--config", str(config)) == (0, healthz, "")
    assert await _health(env={"FLIGHTREC_CONFIG": str(config)}) == (0, healthz, "")
    assert await _health(env={"FLIGHTREC_PORT": str(port)}) == (0, healthz, "")
    assert await _health("--port", str(port)) == (0, healthz, "")
    ready = f"ok: http://127.0.0.1:{port}/readyz 200 ready\n"
    assert await _health("--ready", env={"FLIGHTREC_CONFIG": str(config)}) == (0, ready, "")


async def test_health_fails_in_one_line_when_nothing_serves() -> None:
    with reserved_port() as port:  # bound, not listening: connections are refused
        status, out, err = await _health(env={"FLIGHTREC_PORT": str(port)})
    assert (status, out) == (1, "")
    assert err == (
        f"unhealthy: http://127.0.0.1:{port}/healthz: "
        "connection refused (is flightrec serving on this port?)\n"
    )


async def _not_ready(request: web.Request) -> web.Response:
    body = {"status": "not ready", "reason": "database unavailable: connection refused"}
    return web.json_response(body, status=503)


async def test_health_ready_says_why_not() -> None:
    app = web.Application()
    app.router.add_get("/readyz", _not_ready)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        port = int((await start_site(runner)).rsplit(":", 1)[1])
        status, out, err = await _health("--ready", "--port", str(port))
    finally:
        await runner.cleanup()
    assert (status, out) == (1, "")
    assert err == (
        f"unhealthy: http://127.0.0.1:{port}/readyz 503 "
        "not ready: database unavailable: connection refused\n"
    )


async def test_health_a_bad_config_is_one_line(tmp_path: Path) -> None:
    assert await _health(env={"FLIGHTREC_PORT": "eighty"}) == (
        1,
        "",
        "Error: FLIGHTREC_PORT: expected an integer, got 'eighty'\n",
    )
