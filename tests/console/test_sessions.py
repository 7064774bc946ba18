"""Sessions (SPEC section 8) through the real proxy, the writer and the console API, on SQLite
and PostgreSQL: a chat continued without any header, `X-Flightrec-Session`, and a Responses
`previous_response_id` chain each become one session, whatever batch their turns are written
in; the list filters by session and the exchange links its session."""

from __future__ import annotations

from typing import Any

from proxy.store.migrate import upgrade
from tests import dbs
from tests.conftest import FakeUpstream, ProxyFactory, Sdk
from tests.console.sessions_data import QUESTIONS, talk
from tests.console_data import console_app

db_url = dbs.db_url  # fixture


async def test_three_turns_without_a_header_are_one_session(
    aiohttp_client: Any, db_url: str, upstream: FakeUpstream, make_proxy: ProxyFactory, sdk: Sdk
) -> None:
    talks = await talk(upstream, make_proxy, sdk)
    await upgrade(db_url)
    await dbs.store(db_url, [talks.chat[0], talks.other, *talks.responses[:1]])
    await dbs.store(db_url, [*talks.chat[1:], *talks.header, *talks.responses[1:]])
    client = await aiohttp_client(console_app(db_url))

    root = talks.chat[0].id
    found = await (await client.get(f"/api/sessions/{root}")).json()
    assert set(found) == {"id", "kind", "exchanges", "started_at", "ended_at", "cost_usd", "usage"}
    assert (found["id"], found["kind"]) == (root, "chat")
    assert [item["id"] for item in found["exchanges"]] == [ex.id for ex in talks.chat]
    assert found["usage"]["prompt_tokens"] == 20 + 40 + 60
    assert found["usage"]["completion_tokens"] == 21
    costs = [item["cost_usd"] for item in found["exchanges"]]
    assert all(costs) and found["cost_usd"] == sum(costs)
    assert found["started_at"] == found["exchanges"][0]["started_at"]

    header = await (await client.get("/api/sessions/sess-42")).json()
    assert header["kind"] == "header"
    assert [item["id"] for item in header["exchanges"]] == [ex.id for ex in talks.header]
    chain = await (await client.get(f"/api/sessions/{talks.responses[0].id}")).json()
    assert chain["kind"] == "responses" and len(chain["exchanges"]) == 2

    listed = await (await client.get("/api/exchanges", params={"session": root})).json()
    assert [item["id"] for item in listed["items"]] == [ex.id for ex in reversed(talks.chat)]
    shown = await (await client.get(f"/api/exchanges/{talks.chat[2].id}")).json()
    assert shown["session"] == root
    alone = await (await client.get(f"/api/exchanges/{talks.other.id}")).json()
    assert alone["session"] is None
    missing = await client.get("/api/sessions/nope")
    assert missing.status == 404 and (await missing.json())["error"]["param"] == "id"

    page = await (await client.get(f"/sessions/{root}")).text()
    assert page.count('class="turn"') == 3 and "Turn 3" in page
    assert QUESTIONS[0] in page and "<script>window.pwned" not in page
    exchange_page = await (await client.get(f"/exchanges/{talks.chat[1].id}")).text()
    assert f'href="/sessions/{root}"' in exchange_page
