"""The evaluation of alerts and budgets over a real database (both engines): each crossing is
moved once, by one of several watchers, and delivered to a real webhook receiver once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from aiohttp import web
from click.testing import CliRunner
from prometheus_client import CollectorRegistry, generate_latest

from proxy.alert_rules import Blocked
from proxy.alerts import state
from proxy.alerts.watch import Watcher
from proxy.cli.main import main
from proxy.config import Config, load
from proxy.console import build_console
from proxy.exchange import Exchange
from proxy.store import create_engine
from proxy.store import tables as t
from tests.conftest import serving
from tests.dbs import chat_exchange, db_url, recorded, store

__all__ = ["db_url"]

NOW = datetime(2026, 11, 27, 10, 0, 0, tzinfo=UTC)
COST = 8.25e-6
"""What `chat_exchange` costs at gpt-4o-mini's shipped prices: 5 uncached prompt tokens at
$0.15/M, 4 cached at $0.075/M, 12 output at $0.60/M."""


def config(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "alerts.toml"
    path.write_text(text)
    return load(path, env={})


def at(seconds_before: float, **fields: Any) -> Exchange:
    return chat_exchange(started_at=NOW.timestamp() - seconds_before, **fields)


class Receiver:
    """A webhook receiver: a real aiohttp server collecting each posted body's `text`."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.texts.append(orjson.loads(await request.read())["text"])
        return web.Response(text="ok")


@pytest.fixture
async def hook() -> AsyncIterator[tuple[Receiver, str]]:
    receiver = Receiver()
    async with serving("/hook", receiver.handle) as url:
        yield receiver, url + "/hook"


async def rounds(url: str, watchers: list[Watcher], now: datetime) -> list[state.Move]:
    """One evaluation by each watcher at once, each with its own engine (as processes)."""
    engines = [create_engine(url) for _ in watchers]
    try:
        found = await asyncio.gather(
            *(w.evaluate(e, now) for w, e in zip(watchers, engines, strict=True))
        )
    finally:
        for engine in engines:
            await engine.dispose()
    return [move for moves in found for move in moves]


async def delivered(watchers: list[Watcher]) -> None:
    for watcher in watchers:
        await watcher.delivery.stop()


async def test_spend_fires_once_among_watchers_and_clears_below_clear(
    db_url: str, tmp_path: Path, hook: tuple[Receiver, str]
) -> None:
    receiver, hook_url = hook
    cfg = config(tmp_path, f"""
[[alerts]]
name = "spend"
kind = "spend"
window = "60s"
threshold = 0.00002
webhook_url = "{hook_url}"
""")  # fmt: skip
    # Three in the window ($24.75e-6 > $20e-6), at 50, 30 and 10 seconds before NOW.
    await recorded(db_url, [at(50), at(30), at(10), at(500)])
    watchers = [Watcher(cfg, Blocked()) for _ in range(3)]
    moves = await rounds(db_url, watchers, NOW)
    assert [(m.alert, m.previous, m.state) for m in moves] == [("spend", "ok", "firing")]
    assert await rounds(db_url, watchers, NOW) == []
    # 20 s later two are left ($16.5e-6): between clear ($16e-6) and threshold, still firing.
    assert await rounds(db_url, watchers, NOW.replace(second=20)) == []
    # 40 s later one is left ($8.25e-6): cleared, once.
    moves = await rounds(db_url, watchers, NOW.replace(second=40))
    assert [(m.previous, m.state) for m in moves] == [("firing", "ok")]
    await delivered(watchers)
    assert len(receiver.texts) == 2
    assert receiver.texts[0] == (
        "flightrec alert spend FIRING: $0.000025 spent over 1m (threshold 2e-05, spend)"
    )
    assert "cleared" in receiver.texts[1]
    engine = create_engine(db_url)
    try:
        events = await state.events(engine)
    finally:
        await engine.dispose()
    assert [(e["previous"], e["state"]) for e in events] == [("firing", "ok"), ("ok", "firing")]


async def test_alert_by_group_fires_per_group(db_url: str, tmp_path: Path) -> None:
    cfg = config(tmp_path, """
[[alerts]]
name = "per-team"
kind = "spend"
window = "1h"
by = "tag:team"
threshold = 0.00001
""")  # fmt: skip
    await recorded(db_url, [at(5, tags={"team": "a"}), at(6, tags={"team": "a"}),
                            at(7, tags={"team": "b"})])  # fmt: skip
    moves = await rounds(db_url, [Watcher(cfg, Blocked())], NOW)
    assert [(m.group, m.state) for m in moves] == [("a", "firing")]


def with_logprobs(ex: Exchange, values: list[float]) -> Exchange:
    choice = ex.response_json["choices"][0]
    choice["logprobs"] = {
        "content": [
            {"token": "t", "logprob": v, "bytes": [116], "top_logprobs": []} for v in values
        ]
    }
    ex.response_body = orjson.dumps(ex.response_json)
    return ex


async def test_confidence_drop_and_fingerprint_change_fire_once(
    db_url: str, tmp_path: Path
) -> None:
    cfg = config(tmp_path, """
[[alerts]]
name = "confidence"
kind = "confidence"
window = "10m"
baseline = "1h"
threshold = 0.5

[[alerts]]
name = "backend"
kind = "fingerprint_change"
window = "10m"
""")  # fmt: skip
    baseline = [
        with_logprobs(at(1200 + i, fingerprint="fp_a"), [-0.1, -0.2, -0.3]) for i in range(3)
    ]
    await recorded(db_url, baseline)
    watcher = Watcher(cfg, Blocked())
    assert await rounds(db_url, [watcher], NOW) == []  # no window traffic, no change yet
    recent = [with_logprobs(at(60 + i, fingerprint="fp_b"), [-1.0, -1.2, -0.8]) for i in range(2)]
    await store(db_url, recent)
    moves = await rounds(db_url, [watcher, Watcher(cfg, Blocked())], NOW)
    found = {(m.alert, m.group, m.state): m.detail for m in moves}
    assert set(found) == {
        ("confidence", "gpt-4o-mini-2024-07-18", "firing"),
        ("backend", "openai/gpt-4o-mini-2024-07-18", "firing"),
    }
    assert found[("confidence", "gpt-4o-mini-2024-07-18", "firing")] == (
        "mean logprob -1.000 over 10m, baseline -0.200"
    )
    assert found[("backend", "openai/gpt-4o-mini-2024-07-18", "firing")] == (
        "new system_fingerprint fp_b"
    )
    assert await rounds(db_url, [watcher], NOW) == []


async def test_unpriced_and_error_rate(db_url: str, tmp_path: Path) -> None:
    cfg = config(tmp_path, """
[[alerts]]
name = "unpriced"
kind = "unpriced"

[[alerts]]
name = "errors"
kind = "error_rate"
window = "1h"
threshold = 0.3
min_count = 4
""")  # fmt: skip
    failed = at(3, model="gpt-4o-mini")
    failed.status, failed.outcome = 502, "upstream_error"
    await recorded(db_url, [at(1, model="no-such-model"), at(2), failed])
    watcher = Watcher(cfg, Blocked())
    moves = await rounds(db_url, [watcher], NOW)
    # One failure in three: above 0.3, but under min_count: not judged.
    assert [(m.alert, m.group) for m in moves] == [("unpriced", "no-such-model-2024-07-18")]
    await store(db_url, [at(4)])
    moves = await rounds(db_url, [watcher], NOW)
    assert moves == []  # one in four: 0.25, not above 0.3
    other = at(5)
    other.status, other.outcome = None, "client_disconnected"
    await store(db_url, [other])
    moves = await rounds(db_url, [watcher], NOW)
    assert [(m.alert, m.group, m.value) for m in moves] == [("errors", "", 0.4)]


async def test_budgets_alert_at_each_level_and_block_only_when_asked(
    db_url: str, tmp_path: Path
) -> None:
    cfg = config(tmp_path, """
[[budgets]]
name = "team-a"
scope = "tag:team=a"
period = "day"
limit_usd = 0.00004
action = "block"

[[budgets]]
name = "alice"
scope = "user:alice"
period = "month"
limit_usd = 0.00001
""")  # fmt: skip
    today = [at(60, tags={"team": "a"}) for _ in range(3)]  # 24.75e-6: 61%
    yesterday = at(11 * 3600, tags={"team": "a"})  # another day: not counted
    await recorded(db_url, [*today, yesterday, at(30, user="alice")])
    blocked = Blocked()
    watcher = Watcher(cfg, blocked)
    moves = await rounds(db_url, [watcher], NOW)
    assert [(m.alert, m.state) for m in moves] == [("team-a", "50"), ("alice", "80")]
    assert not blocked.budgets
    await store(db_url, [at(20, tags={"team": "a"}), at(10, tags={"team": "a"}),
                         at(5, user="alice")])  # fmt: skip
    moves = await rounds(db_url, [watcher], NOW)
    assert [(m.alert, m.state) for m in moves] == [("team-a", "100"), ("alice", "100")]
    assert [b.name for b in blocked.budgets] == ["team-a"]
    # The next day the spend starts over: back under 50 %, no longer blocked.
    moves = await rounds(db_url, [watcher], NOW.replace(day=28))
    assert [(m.alert, m.state) for m in moves] == [("team-a", "ok")]
    assert not blocked.budgets


async def test_state_survives_a_new_watcher(db_url: str, tmp_path: Path) -> None:
    cfg = config(tmp_path, '[[alerts]]\nname = "s"\nkind = "spend"\nwindow = "1h"\nthreshold = 0\n')
    await recorded(db_url, [at(1)])
    assert len(await rounds(db_url, [Watcher(cfg, Blocked())], NOW)) == 1
    assert await rounds(db_url, [Watcher(cfg, Blocked())], NOW) == []  # as after a restart
    engine = create_engine(db_url)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(sa.select(t.alert_state.c.state))).scalars().all()
    finally:
        await engine.dispose()
    assert rows == ["firing"]
    assert time.time() > 0


async def test_console_alerts_page_shows_now_and_past(
    db_url: str, tmp_path: Path, aiohttp_client: Any
) -> None:
    cfg = config(tmp_path, """
[[alerts]]
name = "spend"
kind = "spend"
window = "60s"
threshold = 0.00001

[[alerts]]
name = "quiet"
kind = "unpriced"
""")  # fmt: skip
    await recorded(db_url, [at(30), at(10)])
    watcher = Watcher(cfg, Blocked())
    await rounds(db_url, [watcher], NOW)
    await rounds(db_url, [watcher], NOW.replace(minute=5))  # the window is empty: cleared
    await rounds(db_url, [watcher], NOW)  # and over it again
    client = await aiohttp_client(build_console(replace(cfg, db_url=db_url)))
    response = await client.get("/alerts")
    assert response.status == 200
    page = await response.text()
    now, past = page.split("<h2>Past</h2>")
    assert now.count("<tr class=") == 2
    assert '<tr class="state-firing"><td>spend</td>' in now
    assert "$0.000017 spent over 1m" in now
    assert '<tr class="state-ok"><td>quiet</td>' in now
    assert "unpriced over 1h, by model: above 0" in now
    assert past.count("ok → firing") == 2
    assert past.count("firing → ok") == 1
    assert "no traffic over 1m" in past


async def test_metrics_gauges_and_the_alerts_command(db_url: str, tmp_path: Path) -> None:
    cfg = config(tmp_path, f"""
db_url = "{db_url}"

[[alerts]]
name = "spend"
kind = "spend"
window = "1h"
by = "model"
threshold = 0.00001

[[budgets]]
name = "alice"
scope = "user:alice"
period = "month"
limit_usd = 1.0
""")  # fmt: skip
    await recorded(db_url, [at(30), at(10)])
    registry = CollectorRegistry()
    await rounds(db_url, [Watcher(cfg, Blocked(), registry)], NOW)
    text = generate_latest(registry).decode()
    assert 'flightrec_alert_firing{alert="spend",group="gpt-4o-mini-2024-07-18"} 1.0' in text
    assert 'flightrec_alert_value{alert="spend",group="gpt-4o-mini-2024-07-18"} 1.65e-05' in text
    assert 'flightrec_alert_firing{alert="alice",group=""} 0.0' in text
    path = tmp_path / "alerts.toml"
    result = await asyncio.to_thread(
        CliRunner().invoke, main, ["alerts", "--config", str(path), "--json"]
    )
    assert result.exit_code == 0, result.output
    found = orjson.loads(result.output)
    assert [(f["name"], f["group"], f["state"]) for f in found] == [
        ("spend", "gpt-4o-mini-2024-07-18", "firing"),
        ("alice", "", "ok"),
    ]
    assert found[0]["rule"] == "spend over 1h by model > 1e-05"
    assert found[0]["detail"] == "$0.000017 spent over 1h"
    assert found[1]["rule"] == "budget user:alice $1/month alert"
    result = await asyncio.to_thread(CliRunner().invoke, main, ["alerts", "--config", str(path)])
    assert result.output.splitlines()[0].startswith(
        "firing   spend [gpt-4o-mini-2024-07-18] (spend over 1h by model > 1e-05) since "
    )
