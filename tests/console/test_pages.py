"""The console's pages over HTTP: exports of the current filter through the CLI's writers,
pages for bad parameters and unknown ids, every choice, tool calls and refusals, pagination
that keeps the filter, and the fingerprints page."""

from __future__ import annotations

import csv
import html
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient

from proxy.config import ConfigError
from proxy.privacy.redact import parse_rules
from tests.console_data import BIG, Seeded, console_app, seeded_client, write
from tests.dbs import chat_exchange, sqlite_url

Client = TestClient[Any, Any]


@pytest.fixture
async def site(aiohttp_client: Any, tmp_path: Path) -> AsyncIterator[tuple[Client, Seeded]]:
    async for pair in seeded_client(aiohttp_client, sqlite_url(tmp_path / "pages.db")):
        yield pair


async def text(client: Client, path: str, status: int = 200) -> str:
    response = await client.get(path)
    assert response.status == status, path
    return await response.text()


async def test_export_the_current_filter(site: tuple[Client, Seeded]) -> None:
    client, s = site
    expected = {s.original.id, s.replay.id}
    rows = list(csv.DictReader(io.StringIO(await text(client, "/export?format=csv&user=cat"))))
    assert {row["id"] for row in rows} == expected
    lines = (await text(client, "/export?format=jsonl&user=cat")).splitlines()
    records = [json.loads(line) for line in lines]
    assert {r["id"] for r in records} == expected
    shown = await (await client.get(f"/api/exchanges/{s.original.id}")).json()
    shown.pop("replays")
    assert next(r for r in records if r["id"] == s.original.id) == shown
    har = json.loads(await text(client, "/export?format=har&q=colours"))
    assert len(har["log"]["entries"]) == 2
    assert "format" in await text(client, "/export?format=pdf", 400)
    listed = await text(client, "/exchanges?user=cat")
    assert 'href="/export?user=cat&amp;format=csv"' in listed


async def test_bad_parameters_and_unknown_ids_are_pages(site: tuple[Client, Seeded]) -> None:
    client, _ = site
    page = await text(client, "/exchanges?status=abc", 400)
    assert "status: expected an HTTP status" in page and "<!doctype html>" in page
    assert "no exchange with id" in await text(client, "/exchanges/nope", 404)
    assert "no page at /nowhere" in await text(client, "/nowhere", 404)
    assert "not a replay" in await text(client, "/exchanges/" + site[1].original.id + "/diff", 404)


async def test_pages_keep_the_filter_across_pages(site: tuple[Client, Seeded]) -> None:
    client, s = site
    first = await text(client, "/exchanges?limit=2&model=gpt-4o-mini")
    assert first.count("<tr data-id=") == 2
    start = first.index('rel="next"') - 300
    link = first[start:].split('href="', 1)[1].split('"', 1)[0].replace("&amp;", "&")
    assert "model=gpt-4o-mini" in link and "limit=2" in link and "cursor=" in link
    second = await text(client, link)
    assert "« Newest" in second and s.old.id not in second  # gpt-4o is filtered out


async def test_choices_tool_calls_and_refusals(aiohttp_client: Any, tmp_path: Path) -> None:
    ex = chat_exchange()
    function = {"name": "get_weather", "arguments": '{"city":"Paris","days":2}'}
    call = {"id": "call_1", "type": "function", "function": function}
    ex.response_json["choices"] = [
        {"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [call]},
         "finish_reason": "tool_calls"},
        {"index": 1, "message": {"role": "assistant", "content": None, "refusal": "I can't."},
         "finish_reason": "stop"},
    ]  # fmt: skip
    ex.response_body = orjson.dumps(ex.response_json)
    tool = {"role": "tool", "tool_call_id": "call_0", "content": "22C"}
    ex.request_json["messages"].append(tool)
    ex.request_body = orjson.dumps(ex.request_json)
    url = sqlite_url(tmp_path / "choices.db")
    await write(url, [ex])
    client = await aiohttp_client(console_app(url))
    page = html.unescape(await text(client, f"/exchanges/{ex.id}"))
    assert "Answers (2 choices)" in page
    assert "get_weather" in page and '"city": "Paris"' in page  # formatted JSON
    assert "I can't." in page and "finish: tool_calls" in page
    assert "role-tool" in page and "call_0" in page


async def test_a_redacted_exchange_says_by_which_rules(aiohttp_client: Any, tmp_path: Path) -> None:
    """Every shape of the `redacted` note renders: with what was not kept, rules only, and the
    note of a redaction that failed (no rules, `failed`)."""
    notes: dict[str, dict[str, Any]] = {
        "api_key, email · not kept: raw_stream, logprobs": {
            "rules": ["api_key", "email"],
            "dropped": ["raw_stream", "logprobs"],
        },
        'class="redacted">email</dd>': {"rules": ["email"]},
        'class="redacted">(failed: no body kept)</dd>': {"rules": [], "failed": True},
    }
    exchanges = {shown: chat_exchange() for shown in notes}
    for shown, ex in exchanges.items():
        ex.redacted = notes[shown]
    plain = chat_exchange()
    url = sqlite_url(tmp_path / "redacted.db")
    await write(url, [*exchanges.values(), plain])
    client = await aiohttp_client(console_app(url))
    for shown, ex in exchanges.items():
        page = await text(client, f"/exchanges/{ex.id}")
        assert "<dt>Redacted</dt>" in page and shown in page, shown
    assert "<dt>Redacted</dt>" not in await text(client, f"/exchanges/{plain.id}")


async def test_the_console_export_applies_the_configured_rules(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    """A record stored before a rule existed comes out of the console's export redacted, as
    out of `flightrec export`."""
    address = "jane.doe@example.org"
    ex = chat_exchange()
    ex.request_json = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": address}]}
    ex.request_body = orjson.dumps(ex.request_json)
    url = sqlite_url(tmp_path / "old.db")
    await write(url, [ex])
    plain = await aiohttp_client(console_app(url))
    assert address in await text(plain, "/export?format=jsonl")
    rules = parse_rules([{"preset": "email"}], ConfigError)
    client = await aiohttp_client(console_app(url, redact=rules))
    for fmt in ("jsonl", "csv", "har"):
        exported = await text(client, f"/export?format={fmt}")
        assert address not in exported and "[REDACTED:email]" in exported, fmt


async def test_fingerprints_page(site: tuple[Client, Seeded]) -> None:
    client, _ = site
    page = await text(client, "/fingerprints")
    for fingerprint in ("fp_test", "fp_two", "fp_new"):
        assert f'href="/exchanges?fingerprint={fingerprint}' in page
    assert page.count("<rect") >= 3


async def test_a_long_message_shows_its_beginning_and_links_to_all_of_it(
    site: tuple[Client, Seeded],
) -> None:
    """A 1 MB prompt: the exchange page stays small (no raw JSON embedded, the message cut)
    and links to the whole text and to the raw JSON."""
    client, s = site
    page = await text(client, f"/exchanges/{s.big.id}")
    assert len(page.encode()) < 100_000
    assert BIG not in page and BIG[:20_000] in page
    assert "20,000 of 1,048,576 characters shown" in page
    link = f"/exchanges/{s.big.id}/text/request/0"
    assert f'href="{link}"' in page and f'href="/api/exchanges/{s.big.id}"' in page
    whole = await text(client, link)
    assert BIG in whole and "show all" not in whole
    raw = await (await client.get(f"/api/exchanges/{s.big.id}")).json()
    assert raw["request"]["messages"][0]["content"] == BIG
    short = await text(client, f"/exchanges/{s.original.id}")
    assert "show all" not in short and "Name three colours of the sky" in short
    answer = await text(client, f"/exchanges/{s.original.id}/text/answer/0")
    assert "Blue, grey and orange at dusk." in answer
    for wrong in ("request/1", "answer/9", "nowhere/0", "request/x"):
        await text(client, f"/exchanges/{s.big.id}/text/{wrong}", 404)


async def test_the_cost_chart_says_unpriced_never_zero(site: tuple[Client, Seeded]) -> None:
    client, s = site
    page = html.unescape(await text(client, "/cost?by=model&bucket=hour"))
    chart = page[page.index("Spend (USD) per hour") : page.index("Tokens (prompt")]
    tips = [part.split("</title>")[0].split(" UTC · ", 1)[-1] for part in chart.split("<title>")]
    parts = [part for tip in tips[1:] for part in tip.split(", ") if ": " in part]
    unpriced = [part for part in parts if "house-model-9" in part]
    assert unpriced and all(part.endswith(": unpriced") for part in unpriced), unpriced
    priced = [part for part in parts if str(s.old.model) in part]
    assert priced and all(": $" in part for part in priced), priced  # priced models keep dollars
    assert not [part for part in parts if part.endswith(": $0")]  # a bucket's absent groups


async def test_old_list_links_go_to_the_list(site: tuple[Client, Seeded]) -> None:
    client, _ = site
    old = await client.get("/?limit=2&q=colours&user=cat", allow_redirects=False)
    assert old.status == 302
    assert old.headers["Location"] == "/exchanges?limit=2&q=colours&user=cat"
    shared = await text(client, "/?user=cat")  # a filter both pages have: the overview
    assert "<h1>Overview</h1>" in shared and 'href="/exchanges?user=cat&amp;since=7d"' in shared
