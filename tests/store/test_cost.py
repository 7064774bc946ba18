"""Cost auditing end to end, on SQLite and PostgreSQL: the real openai SDK -> the proxy (a
config with its own prices) -> a fake upstream; stored costs checked against hand-computed
ones, then `flightrec cost` read back as JSON, CSV and a table, and `--reprice`."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import random
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from aiohttp import web
from click.testing import CliRunner
from openai.types.chat import ChatCompletionMessageParam

from proxy import config as config_mod
from proxy.cli.main import main
from proxy.exchange import Exchange
from proxy.relay.app import build_app, make_runner
from proxy.store import create_engine, upgrade
from proxy.store.filters import Filters
from proxy.store.recorder import DatabaseRecorder
from proxy.store.report import cost_report, total, usd
from tests import dbs
from tests.cli.test_cli_store import cli
from tests.conftest import FakeUpstream, Sdk, completion, start_site
from tests.dbs import chat_exchange, chat_usage
from tests.relay.test_record_e2e import query
from tests.stream.test_other_endpoints import RESPONSE, TEXT_PIECES, as_sse, responses_events
from tests.streamgen import chunks_to_sse, completion_to_chunks

db_url = dbs.db_url  # fixture

KEY_A = "sk-proj-teamAsecret0000000000AAAA"
KEY_B = "sk-proj-teamBsecret0000000000BBBB"
HOUSE_PRICES = '[prices."house-model"]\ninput = 0.5\ncached_input = 0.05\noutput = 1.5\n'


@dataclass(frozen=True)
class Model:
    answered: str
    """The model the fake upstream says answered."""
    usage: dict[str, Any]


MODELS = {
    "gpt-4o-mini": Model("gpt-4o-mini-2024-07-18", chat_usage(1000, 200, cached=400)),
    "gpt-5-mini": Model("gpt-5-mini-2025-08-07", chat_usage(2000, 900, cached=1500, reasoning=700)),
    "acme-7b": Model("acme-7b", chat_usage(50, 10)),
    "house-model": Model("house-model", chat_usage(300, 40, cached=100)),
    "gpt-3.5-turbo-instruct": Model("gpt-3.5-turbo-instruct", chat_usage(12, 30)),
    "text-embedding-3-small": Model("text-embedding-3-small", {"prompt_tokens": 5}),
}  # fmt: skip

# Hand-computed, USD per 1M tokens x tokens (genai-prices 0.2.3's data and HOUSE_PRICES).
GPT_4O_MINI = Decimal("0.00024")  # gpt-4o-mini by prefix: 600 x 0.15 + 400 x 0.075 + 200 x 0.60
GPT_5_MINI = Decimal("0.0019625")  # 500 x 0.25 + 1500 x 0.025 + 900 (700 reasoning) x 2.00
HOUSE = Decimal("0.000165")  # config entry: 200 x 0.5 + 100 x 0.05 + 40 x 1.5
INSTRUCT = Decimal("0.000078")  # no cached price: 12 x 1.50 + 30 x 2.00
EMBEDDING = Decimal("0.0000001")  # 5 x 0.02
RESPONSES = Decimal("0.00075")  # gpt-4.1 by prefix: 24 x 2.00 + 12 x 0.50 + 87 x 8.00


async def fake_openai(request: web.Request) -> web.StreamResponse:
    """Chat, legacy completions, embeddings and Responses API, each answering per model."""
    if request.path == "/v1/models":
        return web.json_response({"object": "list", "data": [{"id": "gpt-4o", "object": "model"}]})
    body = await request.json()
    model = MODELS.get(body["model"])
    stream = body.get("stream") is True
    include_usage = (body.get("stream_options") or {}).get("include_usage") is True
    if request.path == "/v1/responses":
        events = as_sse(responses_events(RESPONSE)) if stream else None
        return await _answer(request, RESPONSE, events)
    assert model is not None, body["model"]
    if request.path == "/v1/embeddings":
        vector = [{"object": "embedding", "index": 0, "embedding": [0.25, -0.5]}]
        answer: dict[str, Any] = {"object": "list", "data": vector}
        answer |= {"model": model.answered, "usage": model.usage}
        return await _answer(request, answer, None)
    if request.path == "/v1/completions":
        answer = {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1_723_024_748,
            "model": model.answered,
            "choices": [
                {"index": 0, "text": "Hi there", "logprobs": None, "finish_reason": "stop"}
            ],
            "usage": model.usage,
        }
        events = _legacy_stream(answer, include_usage) if stream else None
        return await _answer(request, answer, events)
    answer = completion(model=model.answered, usage=model.usage)
    chunks = completion_to_chunks(answer, include_usage=include_usage, rng=random.Random(3))
    return await _answer(request, answer, chunks_to_sse(chunks) if stream else None)


def _legacy_stream(answer: dict[str, Any], include_usage: bool) -> bytes:
    head = {k: answer[k] for k in ("id", "object", "created", "model")}
    chunks: list[dict[str, Any]] = [
        {**head, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}]}
        for text in ("Hi", " there")
    ]
    chunks[-1]["choices"][0]["finish_reason"] = "stop"
    if include_usage:
        chunks.append({**head, "choices": [], "usage": answer["usage"]})
    return chunks_to_sse(chunks)


async def _answer(
    request: web.Request, answer: dict[str, Any], events: bytes | None
) -> web.StreamResponse:
    if events is None:
        return web.json_response(answer)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(events)
    return response


@dataclass
class Recorded:
    config_path: Path
    db_url: str
    expected: dict[str, Decimal | None]
    """Exchange id -> hand-computed cost (None: unpriced or nothing to price)."""
    streamed_chat_chunks: list[Any]


def write_config(path: Path, url: str, prices: str = HOUSE_PRICES) -> Path:
    spool = path.parent / "cost.spool"
    path.write_text(f'db_url = "{url}"\nspool_path = "{spool}"\nbatch_interval = 0.01\n{prices}')
    return path


async def run_workload(base_url: str, sdk: Sdk) -> tuple[list[str], list[Any]]:
    """The calls, in order; returns the `X-Flightrec-Id` of each and the streamed chat chunks."""
    ids: list[str] = []

    async def keep_id(response: httpx2.Response) -> None:
        ids.append(response.headers["x-flightrec-id"])

    def client(key: str, **headers: str) -> openai.AsyncOpenAI:
        http = httpx2.AsyncClient(event_hooks={"response": [keep_id]})
        return sdk(base_url, key, max_retries=0, http_client=http, default_headers=headers)

    search = {"X-Flightrec-Tag-Team": "search"}
    ads = {"X-Flightrec-Tag-Team": "ads"}
    alice = client(KEY_A, **{"X-Flightrec-User": "alice"}, **search)
    bob = client(KEY_B, **ads)
    plain_a, plain_b = client(KEY_A), client(KEY_B)
    hello: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]
    chat = alice.chat.completions.create
    await chat(model="gpt-4o-mini", messages=hello)
    await bob.chat.completions.create(model="gpt-5-mini", messages=hello, user="bob")
    await chat(model="acme-7b", messages=hello)
    await client(KEY_B, **search).embeddings.create(model="text-embedding-3-small", input="hi")
    stream = await plain_a.chat.completions.create(
        model="gpt-4o-mini",
        messages=hello,
        stream=True,  # no stream_options: the proxy asks for usage itself
    )
    chunks = [chunk async for chunk in stream]
    legacy = plain_b.completions.create
    carol = {"safety_identifier": "carol"}
    await legacy(model="gpt-3.5-turbo-instruct", prompt="hi", extra_body=carol)
    async for _ in await legacy(model="gpt-3.5-turbo-instruct", prompt="hi", stream=True):
        pass
    plain = await plain_a.responses.create(model="gpt-4.1", input="hello")
    assert plain.output_text == "".join(TEXT_PIECES)
    async for _ in await plain_a.responses.create(model="gpt-4.1", input="hello", stream=True):
        pass
    await bob.chat.completions.create(model="house-model", messages=hello)
    await plain_a.models.list()
    return ids, chunks


EXPECTED = [GPT_4O_MINI, GPT_5_MINI, None, EMBEDDING, GPT_4O_MINI, INSTRUCT, INSTRUCT]
EXPECTED += [RESPONSES, RESPONSES, HOUSE, None]
TOTAL = sum((cost for cost in EXPECTED if cost is not None), Decimal(0))


@pytest.fixture
async def recorded(upstream: FakeUpstream, db_url: str, tmp_path: Path, sdk: Sdk) -> Recorded:
    await upgrade(db_url)
    path = write_config(tmp_path / "flightrec.toml", db_url)
    config = config_mod.load(path, env={}, overrides={"upstream": upstream.url})
    upstream.override = fake_openai
    app = build_app(config, DatabaseRecorder(config))
    runner = make_runner(app, config)
    await runner.setup()
    url = await start_site(runner)
    try:
        ids, chunks = await run_workload(url + "/v1", sdk)
    finally:
        await runner.cleanup()  # as on SIGTERM: the recorder writes out everything
    assert len(ids) == len(EXPECTED)
    return Recorded(path, db_url, dict(zip(ids, EXPECTED, strict=True)), chunks)


async def flightrec(*args: str) -> tuple[int, str, str]:
    """`flightrec ...` in-process (click's runner, off the event loop: it runs its own)."""
    result = await asyncio.to_thread(CliRunner().invoke, main, list(args), env={})
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


async def report(rec: Recorded, *args: str, config: Path | None = None) -> list[dict[str, Any]]:
    """`cost --format json` and `--format csv`, each parsed back exactly; they must agree."""
    path = str(config or rec.config_path)
    code, out, err = await flightrec("cost", "--config", path, "--format", "json", *args)
    assert code == 0, err
    from_json = json.loads(out, parse_float=Decimal)
    code, out, err = await flightrec("cost", "--config", path, "--format", "csv", *args)
    assert code == 0, err
    from_csv = [
        {
            column: (
                (None if value == "" else Decimal(value))
                if column == "cost_usd"
                else (int(value) if column.endswith(("requests", "tokens")) else value or None)
            )
            for column, value in row.items()
        }
        for row in csv.DictReader(io.StringIO(out))
    ]
    assert from_json == from_csv
    return list(from_json)


async def stored(url: str) -> dict[str, tuple[Any, ...]]:
    rows = await query(
        url,
        "SELECT e.id, e.cost_usd, e.price_entry, e.usage_source, e.path, u.prompt_tokens, "
        "u.cached_tokens, u.completion_tokens, u.reasoning_tokens "
        "FROM exchanges e LEFT JOIN usage u ON u.exchange_id = e.id",
    )
    return {row[0]: row[1:] for row in rows}


async def test_every_stored_cost_is_the_hand_computed_one(recorded: Recorded) -> None:
    rows = await stored(recorded.db_url)
    assert set(rows) == set(recorded.expected)
    for exchange_id, expected in recorded.expected.items():
        cost, entry, _, path = rows[exchange_id][:4]
        if expected is None:
            assert cost is None and entry is None, path
        else:  # correctly rounded: equal to the float nearest the exact amount
            assert cost == float(expected), (path, cost, expected)
            assert abs(Decimal(cost) - expected) < Decimal("1e-9")
    entries = {(row[0], row[3]): row[1:] for row in rows.values()}
    assert entries[float(GPT_4O_MINI), "/v1/chat/completions"][0] == (
        "genai-prices 0.2.3 openai/gpt-4o-mini standard"
    )
    assert entries[float(GPT_5_MINI), "/v1/chat/completions"][1:] == (
        "reported", "/v1/chat/completions", 2000, 1500, 900, 700
    )  # fmt: skip
    assert entries[float(HOUSE), "/v1/chat/completions"][0] == "config house-model"
    assert entries[float(EMBEDDING), "/v1/embeddings"][:2] == (
        "genai-prices 0.2.3 openai/text-embedding-3-small standard", "reported"
    )  # fmt: skip
    unknown = [rows[i] for i, cost in recorded.expected.items() if cost is None]
    # The unknown model has usage and no cost; /models has neither and is not unpriced.
    assert sorted((r[3], r[2], r[4]) for r in unknown) == [
        ("/v1/chat/completions", "reported", 50),
        ("/v1/models", None, None),
    ]


async def test_a_stream_that_did_not_ask_for_usage_gets_its_cost(recorded: Recorded) -> None:
    assert all(chunk.usage is None for chunk in recorded.streamed_chat_chunks)  # withheld
    rows = await stored(recorded.db_url)
    injected = [row for row in rows.values() if row[2] == "injected"]
    assert sorted((row[3], row[0]) for row in injected) == [
        ("/v1/chat/completions", float(GPT_4O_MINI)),
        ("/v1/completions", float(INSTRUCT)),
    ]
    assert injected[0][4:] in ((1000, 400, 200, 0), (12, 0, 30, 0))


async def test_responses_api_usage_cost_and_text(recorded: Recorded) -> None:
    rows = await stored(recorded.db_url)
    responses = [i for i, row in rows.items() if row[3] == "/v1/responses"]
    assert len(responses) == 2
    for exchange_id in responses:
        assert rows[exchange_id][0] == float(RESPONSES)
        assert rows[exchange_id][1] == "genai-prices 0.2.3 openai/gpt-4.1 standard"
        assert rows[exchange_id][4:] == (36, 12, 87, 0)
        code, out, err = await flightrec(
            "show", exchange_id, "--json", "--config", str(recorded.config_path)
        )
        assert code == 0, err
        shown = json.loads(out)
        text = shown["response"]["output"][0]["content"][0]["text"]
        assert text == "".join(TEXT_PIECES)
        assert shown["cost_usd"] == float(RESPONSES)
    assert {rows[i][2] for i in responses} == {"reported"}


@pytest.mark.parametrize("by", ["model", "key", "user", "tag:team", "day", "upstream"])
async def test_every_grouping_adds_up_to_the_total(recorded: Recorded, by: str) -> None:
    rows = await report(recorded, "--by", by)
    assert sum(row["cost_usd"] or 0 for row in rows) == TOTAL
    assert sum(row["requests"] for row in rows) == len(EXPECTED)
    assert sum(row["unpriced_requests"] for row in rows) == 1
    assert (
        sum(row["prompt_tokens"] for row in rows)
        == 1000 * 2 + 2000 + 50 + 5 + 12 * 2 + 36 * 2 + 300
    )
    assert sum(row["cached_tokens"] for row in rows) == 400 * 2 + 1500 + 12 * 2 + 100
    assert sum(row["reasoning_tokens"] for row in rows) == 700
    assert len({row["group"] for row in rows}) == len(rows)

    code, table, err = await flightrec("cost", "--config", str(recorded.config_path), "--by", by)
    assert code == 0, err
    last = table.strip().splitlines()[-1].split()
    assert last[0] == "TOTAL" and last[-2:] == [usd(TOTAL), "1"] and last[1] == str(len(EXPECTED))


async def test_groups_and_filters(recorded: Recorded) -> None:
    by_model = {row["group"]: row for row in await report(recorded, "--by", "model")}
    assert by_model["acme-7b"]["cost_usd"] is None  # unknown, not $0
    assert by_model["acme-7b"]["unpriced_requests"] == 1
    assert by_model["gpt-4o-mini-2024-07-18"]["cost_usd"] == 2 * GPT_4O_MINI
    assert by_model["gpt-4o-mini-2024-07-18"]["requests"] == 2

    by_user = {row["group"]: row["cost_usd"] for row in await report(recorded, "--by", "user")}
    assert by_user == {
        "alice": GPT_4O_MINI, "bob": GPT_5_MINI, "carol": INSTRUCT,
        None: GPT_4O_MINI + EMBEDDING + INSTRUCT + 2 * RESPONSES + HOUSE,
    }  # fmt: skip
    by_team = {row["group"]: row["cost_usd"] for row in await report(recorded, "--by", "tag:team")}
    assert by_team == {
        "search": GPT_4O_MINI + EMBEDDING, "ads": GPT_5_MINI + HOUSE,
        None: GPT_4O_MINI + 2 * INSTRUCT + 2 * RESPONSES,
    }  # fmt: skip
    by_key = await report(recorded, "--by", "key")
    assert sorted(row["key_hint"] for row in by_key) == ["sk-...AAAA", "sk-...BBBB"]
    assert all(len(row["group"]) == 16 for row in by_key)

    only = await report(recorded, "--by", "upstream", "--tag", "team=search")
    assert [(r["requests"], r["cost_usd"], r["unpriced_requests"]) for r in only] == [
        (3, GPT_4O_MINI + EMBEDDING, 1)
    ]
    only = await report(recorded, "--by", "day", "--model", "gpt-4o-mini", "--key", "sk-...AAAA")
    assert [(r["requests"], r["cost_usd"]) for r in only] == [(2, 2 * GPT_4O_MINI)]
    assert await report(recorded, "--since", "2099-01-01") == []
    assert await report(recorded, "--until", "2000-01-01T00:00:00Z") == []


async def test_reprice_applies_changed_config_prices(recorded: Recorded, tmp_path: Path) -> None:
    cheaper = HOUSE_PRICES.replace("input = 0.5", "input = 1.0")
    cheaper += '[prices."acme-7b"]\ninput = 1\noutput = 2\n'
    changed = write_config(tmp_path / "changed.toml", recorded.db_url, cheaper)
    code, _, err = await flightrec("cost", "--reprice", "--config", str(changed))
    assert code == 0 and err.splitlines()[0] == f"repriced {len(EXPECTED)} exchanges: 2 changed"

    house = Decimal("0.000265")  # 200 x 1.0 + 100 x 0.05 + 40 x 1.5
    acme = Decimal("0.00007")  # 50 x 1 + 10 x 2
    by_model = {row["group"]: row for row in await report(recorded, "--by", "model")}
    assert by_model["house-model"]["cost_usd"] == house
    assert (by_model["acme-7b"]["cost_usd"], by_model["acme-7b"]["unpriced_requests"]) == (acme, 0)
    assert sum(row["cost_usd"] for row in by_model.values()) == TOTAL - HOUSE + house + acme
    entries = {row[1] for row in (await stored(recorded.db_url)).values()}
    assert {"config house-model", "config acme-7b"} <= entries

    code, _, err = await flightrec("cost", "--reprice", "--config", str(changed))
    assert err.splitlines()[0] == f"repriced {len(EXPECTED)} exchanges: 0 changed"
    code, _, err = await flightrec("cost", "--reprice", "--config", str(recorded.config_path))
    assert err.splitlines()[0] == f"repriced {len(EXPECTED)} exchanges: 2 changed"
    assert sum(row["cost_usd"] or 0 for row in await report(recorded)) == TOTAL


async def test_reprice_dry_run_says_what_would_change_and_writes_nothing(
    recorded: Recorded, tmp_path: Path
) -> None:
    dearer = HOUSE_PRICES.replace("input = 0.5", "input = 1.0")
    dearer += '[prices."acme-7b"]\ninput = 1\noutput = 2\n'
    changed = write_config(tmp_path / "changed.toml", recorded.db_url, dearer)
    before = await stored(recorded.db_url)
    code, _, err = await flightrec("cost", "--reprice", "--dry-run", "--config", str(changed))
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0] == (
        f"repriced {len(EXPECTED)} exchanges: 2 would change (dry run: nothing written)"
    )
    table = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    # house-model: 0.000165 -> 0.000265 (200 x 1.0 + 100 x 0.05 + 40 x 1.5 per 1M);
    # acme-7b: unpriced -> 0.00007 (50 x 1 + 10 x 2 per 1M).
    assert table["house-model"] == ["1", "1", "0.000165", "0.000265", "0", "0"]
    assert table["acme-7b"] == ["1", "1", "0", "0.00007", "1", "0"]
    total = TOTAL + Decimal("0.0001") + Decimal("0.00007")
    assert table["TOTAL"] == [str(len(EXPECTED)), "2", str(TOTAL), str(total), "1", "0"]
    assert await stored(recorded.db_url) == before  # nothing written
    assert sum(row["cost_usd"] or 0 for row in await report(recorded)) == TOTAL

    code, _, err = await flightrec("cost", "--reprice", "--config", str(changed))
    assert err.splitlines()[0] == f"repriced {len(EXPECTED)} exchanges: 2 changed"
    assert err.splitlines()[2:] == lines[2:]  # the same figures, now written
    assert sum(row["cost_usd"] or 0 for row in await report(recorded)) == total
    code, _, err = await flightrec("cost", "--dry-run")
    assert code == 2 and "--dry-run goes with --reprice" in err


async def report_rows(url: str, by: str, filters: Filters | None = None) -> list[dict[str, Any]]:
    engine = create_engine(url)
    try:
        return await cost_report(engine, by, filters)
    finally:
        await engine.dispose()


async def test_what_counts_as_unpriced(db_url: str) -> None:
    priced = chat_exchange(user="priced")
    cut_short = chat_exchange(user="missing", stream=True, usage=None, usage_source="missing")
    cut_short.response_json = {**cut_short.response_json, "usage": None}
    failed = chat_exchange(user="errors", status=429, outcome="upstream_error", usage=None)
    failed.usage_source, failed.response_json = None, {"error": {"message": "slow down"}}
    listed = Exchange.start("GET", "/v1/models", "", "openai")
    listed.user, listed.status, listed.response_json = "errors", 200, {"object": "list"}
    # gpt-5.9 answered: unknown to genai-prices, never priced as gpt-5 or the model asked for.
    other = chat_exchange(model="gpt-5", user="other", response_model="gpt-5.9")
    other.response_json = {**other.response_json, "model": "gpt-5.9"}
    for changed in (cut_short, failed, other):
        changed.response_body = None  # its JSON was changed here: no body text agrees with it
    await dbs.recorded(db_url, [priced, cut_short, failed, listed, other])

    rows = {row["group"]: row for row in await report_rows(db_url, "user")}
    summary = {u: (r["requests"], r["cost_usd"], r["unpriced_requests"]) for u, r in rows.items()}
    assert summary == {
        "priced": (1, Decimal("0.00000825"), 0),  # 5 x 0.15 + 4 x 0.075 + 12 x 0.60
        "missing": (1, None, 1),  # the endpoint reports usage and did not: unknown cost
        "errors": (2, Decimal(0), 0),  # nothing billed: requests that cost nothing
        "other": (1, None, 1),
    }
    by_model = {row["group"] for row in await report_rows(db_url, "model")}
    assert {"gpt-5.9", "gpt-4o-mini-2024-07-18"} <= by_model


async def test_groups_add_up_exactly_with_many_awkward_costs(db_url: str) -> None:
    rng = random.Random(11)
    exchanges = []
    for n in range(300):
        ex = chat_exchange(
            model=rng.choice(["gpt-4o-mini", "gpt-4o", "gpt-5-nano", "o3", "nope-1"]),
            started_at=1_735_689_600.0 + n * 7_000.0,
            user=rng.choice(["a", "b", None]),
            key_hash=rng.choice(["k1" * 8, "k2" * 8]),
            tags={"team": rng.choice("xyz")} if rng.random() < 0.7 else {},
        )
        prompt, completion = rng.randint(0, 50_000), rng.randint(0, 9_000)
        ex.usage = chat_usage(prompt, completion, cached=rng.randint(0, prompt))
        exchanges.append(ex)
    await dbs.recorded(db_url, exchanges)
    costs = [cost for cost, *_ in (await stored(db_url)).values() if cost is not None]
    exact = sum((Decimal(round(cost * 10**9)) for cost in costs), Decimal(0)) * Decimal("1e-9")
    for by in ("model", "key", "user", "tag:team", "day", "upstream"):
        rows = await report_rows(db_url, by)
        assert total(rows)["cost_usd"] == exact, by
        assert total(rows)["requests"] == 300
    days = [row["group"] for row in await report_rows(db_url, "day")]
    assert days[0] == "2025-01-01" and days == sorted(days) and len(days) == 25


async def test_bad_input_is_one_clear_line(tmp_path: Path) -> None:
    url = dbs.sqlite_url(tmp_path / "cost.db")
    await upgrade(url)
    for args, message in (
        (("cost", "--by", "colour"), "Invalid value for '--by'"),
        (("cost", "--by", "tag:"), "expected tag:<key>"),
        (("cost", "--format", "xml"), "Invalid value for '--format'"),
        (("cost", "--since", "soon"), "Invalid value for '--since'"),
        (("cost", "--since", "1d", "--until", "2d"), "--since must be earlier than --until"),
        (("cost", "--tag", "team"), "Invalid value for '--tag'"),
    ):
        run = await cli(*args, db_url=url)
        assert run.code == 2 and message in run.err and "Traceback" not in run.err, run.err
    missing = tmp_path / "typo.db"
    error = (await cli("cost", db_url=dbs.sqlite_url(missing))).one_line_error()
    assert error == f"Error: no database file at {missing}"
    config = tmp_path / "bad.toml"
    config.write_text('[prices."gpt-4o"]\noutput = "lots"\n')
    error = (await cli("cost", "--reprice", "--config", str(config), db_url=url)).one_line_error()
    assert error.startswith("Error: prices.gpt-4o.output: expected a price")
