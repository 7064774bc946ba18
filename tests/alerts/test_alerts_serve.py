"""Alerts and budgets in `flightrec serve` as users run it: real processes, a real webhook
receiver, the real `openai` SDK as client.

- Two `serve` processes on one PostgreSQL database see the traffic; the webhook gets exactly
  one message when the spend crosses and one when it clears, and a restart of both in
  between fires nothing again.
- A fingerprint change and a confidence drop (the fake upstream shifts its logprobs) each
  fire once.
- A blocking budget answers 429 (`budget_exceeded`) and the record says so; a budget that only
  alerts lets its traffic through.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import openai
import orjson
import pytest
from aiohttp import web
from sqlalchemy.engine import make_url

from tests.conftest import completion, serving
from tests.dbs import pg_url
from tests.faultkit import Serve, upstream_process

__all__ = ["pg_url"]

KEY = "sk-alerts-test-0123456789"


@dataclass
class Hook:
    """A webhook receiver: a real aiohttp server keeping each message's `text`."""

    url: str = ""
    texts: list[str] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.texts.append(orjson.loads(await request.read())["text"])
        return web.Response(text="ok")

    def count(self, *words: str) -> int:
        return sum(all(word in text for word in words) for text in self.texts)

    async def wait(self, condition: Callable[[], bool], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"the webhook got only: {self.texts}")
            await asyncio.sleep(0.1)


@pytest.fixture
async def hook() -> AsyncIterator[Hook]:
    found = Hook()
    async with serving("/hook", found.handle) as url:
        found.url = url + "/hook"
        yield found


@dataclass
class AlertServe(Serve):
    """`Serve` with `[[alerts]]`/`[[budgets]]` tables after its own."""

    tables: str = ""

    def write_config(self) -> Path:
        path = super().write_config()
        path.write_text(path.read_text() + "\n" + self.tables)
        return path


def client(url: str, **headers: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=url + "/v1", api_key=KEY, max_retries=0, default_headers=headers or None
    )


async def ask(url: str, count: int, **headers: str) -> None:
    async with client(url, **headers) as sdk:
        for n in range(count):
            await sdk.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": f"hi {n}"}]
            )


async def alert_events(db_url: str) -> list[tuple[str, str]]:
    dsn = make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT previous, state FROM alert_events ORDER BY at")
    finally:
        await conn.close()
    return [(row["previous"], row["state"]) for row in rows]


async def test_two_serves_on_postgresql_deliver_each_crossing_once_across_a_restart(
    tmp_path: Path, pg_url: str, hook: Hook
) -> None:
    # Each exchange of the fake upstream costs $3.75e-6 (9 prompt tokens at $0.15/M, 4
    # output at $0.60/M): 9 of them in the window are above $3e-5; 6 or fewer are at or
    # below the clear level, $2.4e-5.
    tables = f"""
[[alerts]]
name = "spend"
kind = "spend"
window = "45s"
threshold = 0.00003
notify = ["webhook"]
webhook_url = "{hook.url}"
"""
    with upstream_process() as upstream:
        serves = []
        for n in range(2):
            workdir = tmp_path / f"serve{n}"
            workdir.mkdir()
            settings = {"db_url": pg_url, "alerts_interval": 0.3, "spool_path": "spool"}
            serves.append(AlertServe(workdir, upstream, settings, tables=tables))
        try:
            await asyncio.gather(*(serve.start() for serve in serves))
            began = time.monotonic()
            await asyncio.gather(*(ask(serve.url, 6) for serve in serves))
            await hook.wait(lambda: len(hook.texts) >= 1, 15)
            for serve in serves:  # a restart while it fires: the state is in the database
                serve.stop()
            await asyncio.gather(*(serve.start() for serve in serves))
            assert time.monotonic() - began < 35, "too slow to restart within the window"
            await asyncio.sleep(2)
            assert hook.count("FIRING") == 1, hook.texts
            await hook.wait(lambda: hook.count("cleared") >= 1, 60)
            await asyncio.gather(*(ask(serve.url, 6) for serve in serves))
            await hook.wait(lambda: hook.count("FIRING") >= 2, 15)
            await asyncio.sleep(2)
        finally:
            for serve in serves:
                serve.release()
    assert [text.split(":")[0] for text in hook.texts] == [
        "flightrec alert spend FIRING",
        "flightrec alert spend cleared",
        "flightrec alert spend FIRING",
    ]
    assert hook.texts[0].startswith("flightrec alert spend FIRING: $0.0000")
    assert await alert_events(pg_url) == [("ok", "firing"), ("firing", "ok"), ("ok", "firing")]


class Shifting:
    """An upstream whose fingerprint and token logprobs the test changes."""

    def __init__(self) -> None:
        self.fingerprint = "fp_a"
        self.logprob = -0.1

    async def chat(self, request: web.Request) -> web.Response:
        await request.read()
        tokens = [
            {
                "token": word,
                "logprob": self.logprob,
                "bytes": list(word.encode()),
                "top_logprobs": [],
            }
            for word in ("Hello", " there", "!")
        ]
        body = completion(system_fingerprint=self.fingerprint)
        body["choices"][0]["logprobs"] = {"content": tokens, "refusal": None}
        return web.json_response(body)


async def test_a_fingerprint_change_and_a_confidence_drop_each_fire_once(
    tmp_path: Path, hook: Hook
) -> None:
    tables = f"""
[[alerts]]
name = "backend"
kind = "fingerprint_change"
window = "1m"
webhook_url = "{hook.url}"

[[alerts]]
name = "confidence"
kind = "confidence"
window = "6s"
baseline = "2m"
min_count = 2
threshold = 0.5
webhook_url = "{hook.url}"
"""
    upstream = Shifting()
    async with serving("/v1/chat/completions", upstream.chat) as url:
        settings = {"db_url": f"sqlite+aiosqlite:///{tmp_path / 'f.db'}", "alerts_interval": 0.3}
        serve = AlertServe(tmp_path, url + "/v1", settings, tables=tables)
        try:
            await serve.start()
            await ask(serve.url, 4)
            await asyncio.sleep(7)  # out of the confidence window, into its baseline
            assert hook.texts == []
            upstream.fingerprint, upstream.logprob = "fp_b", -1.5
            await ask(serve.url, 3)
            await hook.wait(lambda: hook.count("FIRING") >= 2, 15)
            await asyncio.sleep(1.5)
        finally:
            serve.release()
    model = "gpt-4o-mini-2024-07-18"
    assert hook.count("FIRING") == 2, hook.texts
    assert hook.count(f"alert backend [fake/{model}] FIRING: new system_fingerprint fp_b") == 1
    assert hook.count(f"alert confidence [{model}] FIRING: mean logprob -1.500 over 6s, ") == 1
    assert hook.count("baseline -0.100 (threshold 0.5, confidence)") == 1


async def test_a_blocking_budget_answers_429_and_a_plain_one_only_alerts(
    tmp_path: Path, hook: Hook
) -> None:
    db = tmp_path / "b.db"
    tables = f"""
[[budgets]]
name = "team-a-daily"
scope = "tag:team=a"
period = "day"
limit_usd = 0.00001
action = "block"
webhook_url = "{hook.url}"

[[budgets]]
name = "team-b-daily"
scope = "tag:team=b"
period = "day"
limit_usd = 0.00001
webhook_url = "{hook.url}"
"""
    with upstream_process() as upstream:
        settings = {"db_url": f"sqlite+aiosqlite:///{db}", "alerts_interval": 0.3}
        serve = AlertServe(tmp_path, upstream, settings, tables=tables)
        try:
            await serve.start()
            await ask(serve.url, 3, **{"X-Flightrec-Tag-Team": "a"})  # $1.125e-5: spent
            await ask(serve.url, 3, **{"X-Flightrec-Tag-Team": "b"})
            await hook.wait(lambda: hook.count("100% reached") >= 2, 15)
            async with client(serve.url, **{"X-Flightrec-Tag-Team": "a"}) as sdk:
                with pytest.raises(openai.RateLimitError) as refused:
                    await sdk.chat.completions.create(
                        model="gpt-4o-mini", messages=[{"role": "user", "content": "more"}]
                    )
            await ask(serve.url, 2, **{"X-Flightrec-Tag-Team": "b"})  # only alerted: through
            await ask(serve.url, 1, **{"X-Flightrec-Tag-Team": "c"})  # out of every scope
            await asyncio.sleep(1)
        finally:
            serve.release()
    error: Any = refused.value.body
    assert refused.value.status_code == 429
    assert error["code"] == "budget_exceeded"
    assert error["message"] == "flightrec: budget 'team-a-daily' exceeded (limit $1e-05 a day)"
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT t.value, e.status, e.outcome, e.model FROM exchanges e "
            "JOIN tags t ON t.exchange_id = e.id ORDER BY e.id"
        ).fetchall()
    assert rows == [
        *[("a", 200, "ok", "gpt-4o-mini")] * 3,
        *[("b", 200, "ok", "gpt-4o-mini")] * 3,
        ("a", 429, "proxy_error", "gpt-4o-mini"),
        *[("b", 200, "ok", "gpt-4o-mini")] * 2,
        ("c", 200, "ok", "gpt-4o-mini"),
    ]
    assert hook.count("budget team-a-daily: 100% reached", "requests in scope are refused") == 1
    assert hook.count("budget team-b-daily: 100% reached") == 1
    assert hook.count("team-b-daily", "refused") == 0
