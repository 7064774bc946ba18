"""Retention as a user runs it: `flightrec prune` (dry run, errors, the config's retention),
the console's cost API and `flightrec cost` unchanged by it, and real `flightrec serve`
processes pruning in the background while they take traffic, on SQLite and on one PostgreSQL
shared by two proxies."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import openai
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from proxy.store import create_engine
from proxy.store import tables as t
from proxy.store.filters import Filters
from proxy.store.prune import PRUNE_LOCK
from proxy.store.report import cost_report
from tests import dbs
from tests.cli.test_cli_store import cli
from tests.conftest import FakeUpstream, reserved_port, wait_until_up
from tests.console_data import seeded_client
from tests.dbs import chat_exchange, recorded

db_url = dbs.db_url  # fixture
pg_url = dbs.pg_url  # fixture

PRUNE_WITHIN = 180.0
"""Seconds `traffic_until` waits for a prune of 20,000 exchanges."""
COST_ARGS = [
    ["--by", "model"],
    ["--by", "key"],
    ["--by", "user", "--since", "2d"],
    ["--by", "tag:team"],
    ["--by", "day", "--tag", "team=red", "--tag", "env=prod"],
    ["--by", "upstream", "--model", "gpt-4o"],
    ["--by", "day", "--until", "1h"],
]


async def cost_outputs(client: Any, url: str) -> list[Any]:
    """`flightrec cost --format json`, `/api/cost` and the daily `/api/cost/series` for
    every set of `COST_ARGS`."""
    found = []
    for args in COST_ARGS:
        printed = await cli("cost", "--format", "json", *args, db_url=url)
        assert printed.code == 0, printed.err
        query = [(a[2:], b) for a, b in zip(args[::2], args[1::2], strict=True)]
        api = await (await client.get("/api/cost", params=query)).json()
        assert api == json.loads(printed.out)
        series = await client.get("/api/cost/series", params=[*query, ("bucket", "day")])
        found.append((args, api, await series.json()))
    return found


async def listed(client: Any) -> set[str]:
    return {item["id"] for item in (await (await client.get("/api/exchanges")).json())["items"]}


async def test_prune_leaves_the_cli_and_the_console_api_totals_alone(
    aiohttp_client: Any, db_url: str
) -> None:
    async for client, seeded in seeded_client(aiohttp_client, db_url):
        before = await cost_outputs(client, db_url)
        old = {seeded.old.id, seeded.tagged.id}  # 3 days and 2 hours ago
        assert old <= await listed(client)

        dry = await cli("prune", "--before", "90m", "--dry-run", db_url=db_url)
        assert dry.code == 0, dry.err
        assert dry.out.startswith("would prune 2 exchanges started before "), dry.out
        assert dry.out.endswith("\ndry run: nothing changed\n") and dry.out.count("\n") == 2
        assert old <= await listed(client)
        assert await cost_outputs(client, db_url) == before

        done = await cli("prune", "--before", "90m", db_url=db_url)
        assert done.code == 0, done.err
        assert done.out.startswith("pruned 2 exchanges started before "), done.out
        assert not old & await listed(client)
        assert await cost_outputs(client, db_url) == before
        page = await client.get("/cost")
        assert page.status == 200


async def test_prune_errors_are_one_line_naming_the_flag(tmp_path: Path) -> None:
    url = dbs.sqlite_url(tmp_path / "e.db")
    assert (await cli("db", "upgrade", db_url=url)).code == 0
    cases = [
        (["--before", "last tuesday"], "--before"),
        (["--before", "2999-01-01"], "--before"),
        (["--before", "5x"], "--before"),
        (["--bodies"], "--bodies needs --before"),
        ([], "give --before T, or set retention_days"),
    ]
    for args, named in cases:
        run = await cli("prune", *args, db_url=url)
        assert run.code != 0, args
        assert len(run.err.strip().splitlines()) == 1 and named in run.err, run.err
        assert "Traceback" not in run.err
    help_text = (await cli("prune", "--help")).out
    assert "90d" in help_text and "ISO date/time" in help_text


async def test_prune_applies_the_configured_retention(tmp_path: Path) -> None:
    url = dbs.sqlite_url(tmp_path / "c.db")
    now = time.time()
    ancient = chat_exchange(started_at=now - 40 * 86400)
    old = chat_exchange(started_at=now - 10 * 86400)
    new = chat_exchange(started_at=now - 3600)
    await recorded(url, [ancient, old, new])
    config = tmp_path / "flightrec.toml"
    config.write_text("retention_days = 30\nretention_bodies_days = 7\n")
    run = await cli("prune", "--config", str(config), db_url=url)
    assert run.code == 0, run.err
    lines = run.out.splitlines()
    assert lines[0].startswith("pruned 1 exchange started before ")
    assert lines[1].startswith("pruned the bodies of 1 exchange started before ")
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            ex = t.exchanges
            rows = (await conn.execute(sa.select(ex.c.id, ex.c.request))).all()
    finally:
        await engine.dispose()
    assert {row.id: row.request is None for row in rows} == {old.id: True, new.id: False}


# --- real `flightrec serve` processes pruning while they take traffic ---


async def start_serve(
    tmp_path: Path, name: str, url: str, upstream: str
) -> tuple[asyncio.subprocess.Process, str, Path]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}
    env |= {
        "FLIGHTREC_SPOOL_PATH": str(tmp_path / f"{name}.spool"),
        "FLIGHTREC_CONSOLE_PORT": "0",
        "FLIGHTREC_RETENTION_DAYS": "7",
        "FLIGHTREC_RETENTION_BODIES_DAYS": "1",
    }
    log_path = tmp_path / f"{name}.log"
    with reserved_port() as port, log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "proxy", "serve", "--port", str(port), "--upstream", upstream,
            "--db", url, env=env, stdout=log, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    proxy = f"http://127.0.0.1:{port}"
    await wait_until_up(proxy + "/readyz", process)
    return process, proxy, log_path


async def stop(process: asyncio.subprocess.Process) -> int:
    process.send_signal(signal.SIGTERM)
    return await asyncio.wait_for(process.wait(), 30)


def old_exchanges(count: int) -> list[Any]:
    """`count` exchanges 30 days old, a second apart, with tags, users and keys."""
    start = time.time() - 30 * 86400
    return [
        chat_exchange(
            started_at=start + i,
            model=("gpt-4o", "gpt-4o-mini", "house-model-9")[i % 3],
            user=f"user-{i % 4}",
            key_hint=f"sk-...{i % 2}{i % 2}{i % 2}{i % 2}",
            key_hash=f"{i % 2}" * 64,
            tags={"team": ("red", "blue")[i % 2]},
        )
        for i in range(count)
    ]


async def all_reports(url: str, until: datetime) -> list[Any]:
    engine = create_engine(url)
    try:
        return [
            await cost_report(engine, by, Filters(until=until))
            for by in ("model", "key", "user", "tag:team", "day", "upstream")
        ]
    finally:
        await engine.dispose()


async def traffic_until(
    proxies: list[str], done: Callable[[], bool], check: Callable[[], Awaitable[None]]
) -> list[str]:
    """Requests through the real SDK, 8 at a time, until `done()`; the ids they got. Bounded
    by time, not by a count of requests: on a loaded machine the pruning process gets less of
    the CPU than the traffic (a quiet run needs ~1,200 rounds of 8, ~10 s)."""
    clients = [openai.AsyncOpenAI(base_url=p + "/v1", api_key="sk-test-retention") for p in proxies]
    ids: list[str] = []
    deadline = time.monotonic() + PRUNE_WITHIN

    async def one(client: openai.AsyncOpenAI) -> None:
        raw = await client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
        )
        ids.append(raw.headers["x-flightrec-id"])

    try:
        while time.monotonic() < deadline:
            await asyncio.gather(*(one(clients[i % len(clients)]) for i in range(8)))
            await check()
            if done():
                return ids
        raise AssertionError(f"pruning did not finish within {PRUNE_WITHIN:.0f} s")
    finally:
        for client in clients:
            await client.close()


async def stored_ids(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return set((await conn.execute(sa.select(t.exchanges.c.id))).scalars())
    finally:
        await engine.dispose()


async def nothing() -> None:
    return None


async def test_serve_prunes_in_the_background_and_loses_no_record(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    url = dbs.sqlite_url(tmp_path / "serve.db")
    await recorded(url, old_exchanges(5000))
    began = datetime.now(UTC)
    before = await all_reports(url, began)
    process, proxy, log = await start_serve(tmp_path, "serve", url, upstream.url)
    try:
        pruned = "retention: pruned 5000 exchanges started before "
        ids = await traffic_until([proxy], lambda: pruned in log.read_text(), nothing)
    finally:
        assert await stop(process) == 0
    assert set(ids) == await stored_ids(url)  # every new one, none of the 5000 old
    assert await all_reports(url, began) == before
    assert "retention: pruned the bodies of 0 exchanges started before " in log.read_text()


async def test_two_proxies_on_postgresql_prune_one_at_a_time(
    tmp_path: Path, pg_url: str, upstream: FakeUpstream
) -> None:
    count = 20_000
    await recorded(pg_url, old_exchanges(count))
    began = datetime.now(UTC)
    before = await all_reports(pg_url, began)
    dsn = make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    watcher = await asyncpg.connect(dsn)
    holders: list[int] = []

    async def sample() -> None:
        holders.append(
            await watcher.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND classid = $1 AND objid = $2 AND database ="
                " (SELECT oid FROM pg_database WHERE datname = current_database())",
                PRUNE_LOCK >> 32,
                PRUNE_LOCK & 0xFFFFFFFF,
            )
        )

    started = await asyncio.gather(
        *(start_serve(tmp_path, name, pg_url, upstream.url) for name in ("a", "b"))
    )
    logs = [log for _, _, log in started]
    pruned = f"retention: pruned {count} exchanges started before "
    try:
        ids = await traffic_until(
            [proxy for _, proxy, _ in started],
            lambda: any(pruned in log.read_text() for log in logs),
            sample,
        )
    finally:
        codes = [await stop(process) for process, _, _ in started]
        await watcher.close()
    assert codes == [0, 0]
    texts = sorted((log.read_text() for log in logs), key=lambda text: pruned not in text)
    assert pruned in texts[0] and pruned not in texts[1]
    assert "retention: another flightrec is pruning this database; next try in" in texts[1]
    assert max(holders) == 1 and 1 in holders, holders
    assert set(ids) == await stored_ids(pg_url)
    assert await all_reports(pg_url, began) == before


async def test_a_run_that_fails_logs_one_line_and_returns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What `serve`'s retention process does when the database is down: one warning, no
    exception; the proxy's loop starts the next run an hour later."""
    from dataclasses import replace

    from proxy.config import Config
    from proxy.store.retention import _run_here

    with reserved_port() as port:  # nothing listens there
        url = f"postgresql+asyncpg://postgres@127.0.0.1:{port}/gone"
        config = replace(Config(), db_url=url, retention_days=7)
        with caplog.at_level("INFO", logger="proxy.store.retention"):
            await _run_here(config, os.getppid())
    lines = [r.getMessage() for r in caplog.records if r.name == "proxy.store.retention"]
    assert len(lines) == 1 and lines[0].startswith("retention: prune failed ("), lines
    assert lines[0].endswith("next try in 3600s") and "\n" not in lines[0]
