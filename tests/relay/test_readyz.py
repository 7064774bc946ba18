"""`/readyz` means "relays and keeps records safe": a real `serve` whose PostgreSQL does not
answer is ready (its journal keeps every record) and says the database's state, in the body
and in `/metrics`; `/readyz/db` is the stricter check, unready until the database answers."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import orjson

from tests.conftest import reserved_port
from tests.faultkit import UNREACHABLE, Serve, drive, upstream_fixture

upstream_url = upstream_fixture


async def test_ready_while_the_database_is_down_and_says_so(
    tmp_path: Path, upstream_url: str
) -> None:
    with reserved_port() as console_port:
        settings = {"db_url": UNREACHABLE, "console_port": console_port}
        serve = Serve(tmp_path, upstream_url, settings)
        try:
            await serve.start()
            calls = await drive(serve.url, rate=10, seconds=0.2)
            relaxed = await serve.readyz()
            strict = await serve.readyz("/readyz/db")
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{console_port}/metrics") as response,
            ):
                metrics = await response.text()
        finally:
            serve.release()
    assert all(c.answered for c in calls)
    assert relaxed[0] == 200, relaxed
    body = orjson.loads(relaxed[1])
    assert body["status"] == "ready"
    assert body["database"].startswith("database unavailable: cannot connect")
    assert strict[0] == 503, strict
    assert orjson.loads(strict[1])["reason"].startswith("database unavailable: cannot connect")
    assert "\nflightrec_database_up 0.0\n" in metrics


async def test_not_ready_when_records_are_not_kept_safe(tmp_path: Path, upstream_url: str) -> None:
    """A journal that is full cannot keep records safe: `/readyz` is 503 and says why."""
    settings = {"db_url": UNREACHABLE, "journal_max_bytes": 4096}
    serve = Serve(tmp_path, upstream_url, settings)
    try:
        await serve.start()
        await drive(serve.url, rate=20, seconds=0.5, pad=2000)
        status, body = await serve.readyz()
    finally:
        serve.release()
    assert status == 503
    assert "full (journal_max_bytes = 4096)" in orjson.loads(body)["reason"]
