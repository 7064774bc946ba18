"""The console while its PostgreSQL is down: a 503 saying why (a page, or the API's JSON
error), never a bare 500; inside `serve` it starts while the database does not answer yet.
PostgreSQL sits behind a TCP relay the tests cut and resume."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web
from sqlalchemy.engine import make_url

from proxy.config import Config
from proxy.console import start_console
from proxy.store import StoreError, upgrade
from tests import dbs
from tests.conftest import reserved_port
from tests.dbs import sqlite_url
from tests.tcprelay import TcpRelay

pg_url = dbs.pg_url  # fixture


@contextlib.asynccontextmanager
async def _relayed(pg: str) -> AsyncIterator[tuple[TcpRelay, str]]:
    target = make_url(pg)
    relay = TcpRelay()
    try:
        port = relay.start(target.host or "127.0.0.1", target.port or 5432)
        yield relay, target.set(port=port).render_as_string(hide_password=False)
    finally:
        relay.close()


@contextlib.asynccontextmanager
async def _console(url: str, *, wait: bool) -> AsyncIterator[str]:
    with reserved_port() as port:
        config = replace(Config(), db_url=url, console_port=port)
        runner = await start_console(config, wait_for_database=wait)
        assert isinstance(runner, web.AppRunner)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()


async def _get(url: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, response.content_type, await response.text()


async def _says_unavailable(console: str, reason: str) -> None:
    status, kind, body = await _get(console + "/api/exchanges")
    assert (status, kind) == (503, "application/json"), body
    error = orjson.loads(body)["error"]
    assert error["type"] == "database_unavailable"
    assert error["message"].startswith(f"database unavailable: {reason}"), error
    for page in ("/", "/cost", "/exchanges/0190ffff-dead-7000-8000-000000000000"):
        status, kind, body = await _get(console + page)
        assert (status, kind) == (503, "text/html"), (page, body)
        assert "<h1>Database unavailable</h1>" in body and reason in body, (page, body)
    for path in ("/static/console.css", "/api/openapi.json"):  # no database needed
        assert (await _get(console + path))[0] == 200, path


async def test_a_database_lost_while_the_console_runs_is_a_503_saying_so(pg_url: str) -> None:
    await upgrade(pg_url)
    async with _relayed(pg_url) as (relay, url), _console(url, wait=False) as console:
        assert (await _get(console + "/api/exchanges"))[0] == 200
        relay.cut()
        await _says_unavailable(console, "ConnectionRefusedError")
        relay.resume()
        assert (await _get(console + "/api/exchanges"))[0] == 200
        assert (await _get(console + "/"))[0] == 200


async def test_inside_serve_the_console_starts_while_the_database_is_down(pg_url: str) -> None:
    await upgrade(pg_url)
    async with _relayed(pg_url) as (relay, url):
        relay.cut()
        with pytest.raises(StoreError, match="cannot connect"):  # `flightrec console` alone
            async with _console(url, wait=False):
                pass
        async with _console(url, wait=True) as console:
            await _says_unavailable(console, "cannot connect to the database")
            relay.resume()
            status, _, body = await _get(console + "/api/exchanges")
            assert status == 200, body
            assert (await _get(console + "/"))[0] == 200


async def test_inside_serve_the_console_starts_before_the_schema_is_made(pg_url: str) -> None:
    """PostgreSQL answered just after the recorder found it down, and the recorder is making
    the schema: the console starts anyway, and answers once the schema is there."""
    async with _console(pg_url, wait=True) as console:
        await _says_unavailable(console, "the database at")
        assert "flightrec db upgrade" in (await _get(console + "/api/exchanges"))[2]
        await upgrade(pg_url)
        assert (await _get(console + "/api/exchanges"))[0] == 200


async def test_a_query_that_is_wrong_stays_a_500_and_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only a database that cannot be used now is a 503: a schema the code does not match (a
    bug, or a hand-edited database) is the server's error, with its traceback in the log."""
    db = tmp_path / "flightrec.db"
    await upgrade(sqlite_url(db))
    with sqlite3.connect(db) as conn:
        conn.execute("ALTER TABLE exchanges RENAME COLUMN model TO model_renamed")
    async with _console(sqlite_url(db), wait=False) as console:
        status, _, body = await _get(console + "/api/exchanges")
    assert status == 500, body
    assert "no such column" in caplog.text
