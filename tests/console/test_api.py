"""The console's JSON API on SQLite and PostgreSQL: the objects the CLI prints, keyset pages,
every filter, 404 and 400 naming the parameter, and cost totals equal to `flightrec cost`."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests import dbs
from tests.cli.test_cli_store import cli
from tests.console_data import HOSTILE, Seeded, seeded_client

db_url = dbs.db_url  # fixture
Client = TestClient[Any, Any]


@pytest.fixture
async def api(aiohttp_client: Any, db_url: str) -> AsyncIterator[tuple[Client, Seeded]]:
    async for pair in seeded_client(aiohttp_client, db_url):
        yield pair


async def get(client: Client, path: str, expect: int = 200, /, **query: Any) -> Any:
    response = await client.get(path, params=query)
    assert response.status == expect, await response.text()
    assert response.content_type == "application/json"
    return await response.json()


async def ids(client: Client, **query: Any) -> list[str]:
    return [item["id"] for item in (await get(client, "/api/exchanges", **query))["items"]]


def newest_first(exchanges: list[Any]) -> list[str]:
    return [ex.id for ex in sorted(exchanges, key=lambda ex: ex.started_at, reverse=True)]


async def test_list_is_logs_json_newest_first_in_keyset_pages(
    api: tuple[Client, Seeded], db_url: str
) -> None:
    client, s = api
    expected = newest_first(s.all())
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        query = {"limit": 2} if cursor is None else {"limit": 2, "cursor": cursor}
        page = await get(client, "/api/exchanges", **query)
        seen += [item["id"] for item in page["items"]]
        cursor = page["next"]
        if cursor is None:
            break
    assert seen == expected
    logs = await cli("logs", "--json", "--limit", "500", db_url=db_url)
    assert logs.code == 0, logs.err
    listed = await get(client, "/api/exchanges", limit=500)
    assert listed["items"] == json.loads(logs.out)
    replay = next(i for i in listed["items"] if i["id"] == s.replay.id)
    for field in ("replay_of", "ttft_ms", "cost_usd", "user", "tags", "outcome", "duration_ms"):
        assert field in replay
    assert replay["replay_of"] == s.original.id


async def test_every_filter(api: tuple[Client, Seeded]) -> None:
    client, s = api
    assert await ids(client, model="gpt-4o") == [s.old.id]
    assert await ids(client, user="bob") == [s.tagged.id]
    assert await ids(client, key="sk-...bbbb") == [s.tagged.id]
    assert await ids(client, key="aaaa") == [s.old.id]  # a prefix of the hash
    assert await ids(client, tag="team=red") == [s.tagged.id]
    both = await client.get("/api/exchanges?tag=team%3Dblue&tag=env%3Dprod")
    assert (await both.json())["items"] == []
    assert await ids(client, outcome="upstream_error") == [s.failed.id]
    assert await ids(client, status="429") == [s.failed.id]
    assert await ids(client, fingerprint="fp_two") == [s.tagged.id]
    assert await ids(client, replay_of=s.original.id) == [s.replay.id]
    assert await ids(client, upstream="nowhere") == []
    assert len(await ids(client, upstream="openai")) == len(s.all())
    assert await ids(client, since="2d") == newest_first([e for e in s.all() if e is not s.old])
    assert await ids(client, until="2d") == [s.old.id]
    assert await ids(client, q="COLOURS OF THE SKY") == [s.replay.id, s.original.id]  # prompt
    assert await ids(client, q="orange at dusk") == [s.original.id]  # answer
    assert await ids(client, q="100%_") == []  # LIKE wildcards are text


async def test_exchange_logprobs_timeline_and_fingerprints(api: tuple[Client, Seeded]) -> None:
    client, s = api
    shown = await get(client, f"/api/exchanges/{s.original.id}")
    assert shown["replays"] == [s.replay.id]
    assert shown["request"]["messages"][0]["content"] == "Name three colours of the sky"
    assert (await get(client, f"/api/exchanges/{s.hostile.id}"))["user"] == HOSTILE
    found = await get(client, f"/api/exchanges/{s.stream.id}/logprobs")
    [choice] = found["choices"]
    assert [t["token"] for t in choice["tokens"]] == ["The", " sky", " is", " blue"]
    assert choice["min"] == -0.75 and choice["mean"] == pytest.approx(-0.375)
    assert choice["perplexity"] == pytest.approx(2.718281828**0.375)
    timeline = await get(client, f"/api/exchanges/{s.stream.id}/timeline")
    assert timeline["pacing"] == [[10, 40.0], [20, 45.0], [30, 300.0], [40, 310.0]]
    assert timeline["ttft_ms"] == 40.0
    rows = await get(client, "/api/fingerprints")
    assert {"fp_test", "fp_two", "fp_new"} <= {r["system_fingerprint"] for r in rows}
    assert set(rows[0]) == {
        "upstream",
        "model",
        "system_fingerprint",
        "first_seen",
        "last_seen",
        "count",
    }


@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("/api/exchanges?limit=0", "limit"),
        ("/api/exchanges?limit=501", "limit"),
        ("/api/exchanges?cursor=garbage", "cursor"),
        ("/api/exchanges?since=yesterday", "since"),
        ("/api/exchanges?since=1h&until=2h", "until"),
        ("/api/exchanges?status=abc", "status"),
        ("/api/exchanges?outcome=great", "outcome"),
        ("/api/exchanges?tag=novalue", "tag"),
        ("/api/exchanges?colour=red", "colour"),
        ("/api/cost?by=colour", "by"),
        ("/api/cost/series?bucket=week", "bucket"),
    ],
)
async def test_bad_parameters_are_400_naming_them(
    api: tuple[Client, Seeded], path: str, param: str
) -> None:
    client, _ = api
    response = await client.get(path)
    assert response.status == 400
    error = (await response.json())["error"]
    assert error["param"] == param and param in error["message"]


async def test_unknown_ids_are_404(api: tuple[Client, Seeded]) -> None:
    client, _ = api
    for tail in ("", "/logprobs", "/timeline"):
        error = (await get(client, f"/api/exchanges/no-such-id{tail}", 404))["error"]
        assert "no-such-id" in error["message"]
    assert (await get(client, "/api/nothing", 404))["error"]["message"]


async def test_openapi_names_every_route(api: tuple[Client, Seeded]) -> None:
    client, _ = api
    doc = await get(client, "/api/openapi.json")
    assert doc["openapi"].startswith("3.")
    one = "/api/exchanges/{id}"
    routes = {"/api/exchanges", one, f"{one}/logprobs", f"{one}/timeline", "/api/cost",
              "/api/cost/series", "/api/fingerprints"}  # fmt: skip
    assert set(doc["paths"]) == routes
    for path in routes:
        assert set(doc["paths"][path]["get"]["responses"]) >= {"200", "400", "401", "503"}
    listed = {p["name"] for p in doc["paths"]["/api/exchanges"]["get"]["parameters"]}
    assert listed >= {"limit", "cursor", "since", "until", "model", "outcome", "status", "user",
                      "key", "tag", "upstream", "fingerprint", "replay_of", "q"}  # fmt: skip


@pytest.mark.parametrize(
    "args",
    [
        ["--by", "model"],
        ["--by", "user", "--since", "2d"],
        ["--by", "tag:team"],
        ["--by", "key", "--tag", "team=red"],
        ["--by", "day", "--model", "gpt-4o-mini"],
        ["--by", "upstream", "--until", "1h"],
    ],
)
async def test_cost_equals_the_cli_and_the_series_adds_up(
    api: tuple[Client, Seeded], db_url: str, args: list[str]
) -> None:
    client, _ = api
    query = [(a[2:], b) for a, b in zip(args[::2], args[1::2], strict=True)]
    printed = await cli("cost", "--format", "json", *args, db_url=db_url)
    assert printed.code == 0, printed.err
    response = await client.get("/api/cost", params=query)
    assert await response.json() == json.loads(printed.out)
    rows = {r["group"]: r for r in json.loads(printed.out)}
    if args == ["--by", "model"]:  # unknown, never $0
        unpriced = rows["house-model-9-2024-07-18"]
        assert (unpriced["cost_usd"], unpriced["unpriced_requests"]) == (None, 1)
    series = await get(client, "/api/cost/series", 200, **dict(query), bucket="hour")
    for entry in series["series"]:
        row = rows[entry["group"]]
        assert sum(p[2] for p in entry["points"]) == row["requests"]
        assert sum(p[3] for p in entry["points"]) == row["prompt_tokens"]
        costs = [p[1] for p in entry["points"] if p[1] is not None]
        if row["cost_usd"] is None:
            assert costs == []
        else:
            assert round(sum(costs), 9) == pytest.approx(row["cost_usd"], abs=1e-12)
