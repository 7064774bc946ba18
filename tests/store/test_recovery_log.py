"""After a crash, `serve` says how many journaled records it recovered and wrote. Real
processes: one `serve` journals while its database is unreachable and is killed; the next
start, with a database that answers, writes what the journal holds and says how many."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from tests.dbs import sqlite_url
from tests.faultkit import (
    UNREACHABLE,
    Serve,
    drive,
    upstream_fixture,
    wait_stored,
)

upstream_url = upstream_fixture


async def test_start_after_a_crash_says_how_many_records_it_recovered(
    tmp_path: Path, upstream_url: str
) -> None:
    serve = Serve(tmp_path, upstream_url, {"db_url": UNREACHABLE})
    try:
        await serve.start()
        calls = await drive(serve.url, rate=20, seconds=0.3)
        assert all(c.answered for c in calls), calls
        await asyncio.sleep(1)  # the last record reaches the journal just after its answer
        serve.kill()
        url = sqlite_url(tmp_path / "after.db")
        serve.settings["db_url"] = url
        await serve.start()
        stored = await wait_stored(url, {c.id for c in calls if c.id}, 20)
        assert len(stored) == len(calls) == 6
        log = serve.log_text().split("--- start 2 ---")[1]
        for _ in range(50):
            if "recovered" in log:
                break
            await serve.exited(0.1)
            log = serve.log_text().split("--- start 2 ---")[1]
        assert re.search(r"journal .*flightrec\.spool: records an earlier run did not write", log)
        assert "recovered 6 journaled records from an earlier run: written to the database" in log
    finally:
        serve.release()
