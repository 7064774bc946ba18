"""The list API's new filters and orders on SQLite and PostgreSQL: any error, a status class,
and sorting by cost, duration, time to first token or oldest first, paged by cursor."""

from __future__ import annotations

import time
from typing import Any

from proxy.store.migrate import upgrade
from tests import dbs
from tests.console.test_overview import traffic, write
from tests.console_data import console_app

db_url = dbs.db_url  # fixture


async def pages(client: Any, **query: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    cursor = None
    while True:
        asked = {**query, "limit": 7, **({"cursor": cursor} if cursor else {})}
        response = await client.get("/api/exchanges", params=asked)
        assert response.status == 200, await response.text()
        page = await response.json()
        found += page["items"]
        if (cursor := page["next"]) is None:
            return found


async def test_sorts_page_by_cursor_and_error_filters(aiohttp_client: Any, db_url: str) -> None:
    await upgrade(db_url)
    await write(db_url, traffic(time.time()))
    client = await aiohttp_client(console_app(db_url))
    newest = await pages(client)
    assert len(newest) == 60
    by_cost = await pages(client, sort="cost")
    assert len(by_cost) == 60 and {i["id"] for i in by_cost} == {i["id"] for i in newest}
    costs = [i["cost_usd"] if i["cost_usd"] is not None else -1.0 for i in by_cost]
    assert costs == sorted(costs, reverse=True)
    durations = [i["duration_ms"] for i in await pages(client, sort="duration")]
    assert durations == sorted(durations, reverse=True) and len(set(durations)) == 60
    assert [i["id"] for i in await pages(client, sort="oldest")] == [
        i["id"] for i in reversed(newest)
    ]
    failed = await pages(client, outcome="error")
    assert len(failed) == 9 and all(i["outcome"] != "ok" for i in failed)
    assert [i["id"] for i in await pages(client, status="5xx")] == [i["id"] for i in failed]
    assert await pages(client, status="4xx") == []
    first = await (await client.get("/api/exchanges", params={"sort": "cost", "limit": 2})).json()
    wrong = await client.get("/api/exchanges", params={"cursor": first["next"]})
    assert wrong.status == 400 and (await wrong.json())["error"]["param"] == "cursor"
    bad = await client.get("/api/exchanges", params={"sort": "price"})
    assert bad.status == 400 and (await bad.json())["error"]["param"] == "sort"
