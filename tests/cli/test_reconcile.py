"""`flightrec reconcile` against a fake of OpenAI's Costs and Usage APIs (a real aiohttp server
paging its buckets as the API reference says, each page checked against the openai SDK's own
admin types) and a record written by the recorder's writer: the difference that traffic which
did not pass through the proxy makes, and the other explanations."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from click.testing import CliRunner
from openai.types.admin.organization.usage_completions_response import UsageCompletionsResponse
from openai.types.admin.organization.usage_costs_response import UsageCostsResponse

from proxy.cli.main import main
from proxy.exchange import Exchange
from proxy.store import upgrade

from .. import dbs
from ..conftest import start_site

db_url = dbs.db_url  # fixture
ADMIN_KEY = "sk-admin-RECONCILE-secret-0123456789"
DAY1 = int(datetime(2026, 11, 20, tzinfo=UTC).timestamp())
DAY2 = DAY1 + 86400


def _usage(model: str, requests: int, tokens_in: int, tokens_out: int) -> dict[str, Any]:
    return {
        "object": "organization.usage.completions.result",
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "input_cached_tokens": 0,
        "num_model_requests": requests,
        "model": model,
    }


def _cost(line_item: str, value: float) -> dict[str, Any]:
    amount = {"value": value, "currency": "usd"}
    return {"object": "organization.costs.result", "amount": amount, "line_item": line_item}


GPT5 = "gpt-5-2025-08-07"
MINI = "gpt-4o-mini-2024-07-18"
BUCKETS = {
    "completions": {
        DAY1: [_usage(GPT5, 3, 4000, 2000), _usage(MINI, 1, 1000, 1000)],
        DAY2: [
            _usage(GPT5, 1, 1000, 500),
            _usage("o3-2025-04-16", 2, 300, 200),
            _usage("gpt-unknown-x", 1, 100, 50),
        ],
    },
    "embeddings": {
        DAY1: [
            {
                "object": "organization.usage.embeddings.result",
                "input_tokens": 1000,
                "num_model_requests": 1,
                "model": "text-embedding-3-small",
            }
        ],
        DAY2: [],
    },
    "costs": {
        DAY1: [
            _cost(f"{GPT5}, input", 0.005),
            _cost(f"{GPT5}, output", 0.02),
            _cost(f"{MINI}, input", 0.00015),
            _cost(f"{MINI}, output", 0.00075),
            _cost("text-embedding-3-small, input", 0.00002),
        ],
        DAY2: [
            _cost(f"{GPT5}, input", 0.00125),
            _cost(f"{GPT5}, output", 0.005),
            _cost("o3-2025-04-16, input", 0.0006),
            _cost("o3-2025-04-16, output", 0.0016),
            _cost("gpt-unknown-x, input", 0.001),
        ],
    },
}
"""Day 1: a third gpt-5 request (2000 in, 1000 out) did not pass through the proxy; the mini's
output is billed at $0.75 per 1M where the record's table says $0.60. Day 2: o3 was called
around the proxy, and a model the table does not know went through it."""
PAGES_SEEN: list[str] = []


async def _report(request: web.Request) -> web.Response:
    kind = {"costs": "costs", "completions": "completions", "embeddings": "embeddings"}[
        request.match_info["kind"]
    ]
    assert request.headers["Authorization"] == f"Bearer {ADMIN_KEY}"
    query = request.query
    assert query["group_by"] == ("line_item" if kind == "costs" else "model")
    assert query["bucket_width"] == "1d"
    assert int(query["start_time"]) == DAY1 and int(query["end_time"]) == DAY2 + 86400
    days = sorted(BUCKETS[kind])
    at = int(query.get("page", "0"))  # one bucket a page: every report pages
    PAGES_SEEN.append(f"{kind}:{at}")
    bucket = {
        "object": "bucket",
        "start_time": days[at],
        "end_time": days[at] + 86400,
        "results": BUCKETS[kind][days[at]],
    }
    more = at + 1 < len(days)
    page = {"object": "page", "data": [bucket], "has_more": more,
            "next_page": str(at + 1) if more else None}  # fmt: skip
    model = UsageCostsResponse if kind == "costs" else UsageCompletionsResponse
    model.model_validate(page)  # the documented shape, as the SDK's types say it
    return web.json_response(page)


@pytest.fixture
async def provider() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_get("/v1/organization/usage/{kind}", _report)
    app.router.add_get("/v1/organization/{kind}", _report)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        yield await start_site(runner) + "/v1"
    finally:
        await runner.cleanup()


def _exchange(
    at: int, model: str, usage: dict[str, Any], path: str = "/v1/chat/completions"
) -> Exchange:
    ex = Exchange.start("POST", path, "", "openai", started_at=at + 3600)
    ex.status, ex.model, ex.response_model = 200, model.split("-20")[0], model
    ex.usage, ex.usage_source = usage, "reported"
    return ex


def _chat(tokens_in: int, tokens_out: int) -> dict[str, Any]:
    total = tokens_in + tokens_out
    return {"prompt_tokens": tokens_in, "completion_tokens": tokens_out, "total_tokens": total}


RECORDED = [
    _exchange(DAY1, GPT5, _chat(1000, 500)),
    _exchange(DAY1, GPT5, _chat(1000, 500)),
    _exchange(DAY1, MINI, _chat(1000, 1000)),
    _exchange(DAY1, "text-embedding-3-small", {"prompt_tokens": 1000, "total_tokens": 1000},
              "/v1/embeddings"),
    _exchange(DAY2, GPT5, _chat(1000, 500)),
    _exchange(DAY2, "gpt-unknown-x", _chat(100, 50)),
]  # fmt: skip


async def flightrec(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    result = await asyncio.to_thread(CliRunner().invoke, main, list(args), env=env)
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def _config(tmp_path: Path, provider: str, db: str) -> str:
    path = tmp_path / "flightrec.toml"
    path.write_text(
        f'db_url = "{db}"\n\n[[upstreams]]\nname = "other"\nbase_url = "http://127.0.0.1:9/v1"\n'
        f'prefix = "/other"\n\n[[upstreams]]\nname = "openai"\nbase_url = "{provider}"\n'
        'prefix = "/v1"\n'
    )
    return str(path)


def _row(day: str, model: str, requests: tuple[int, int], tokens: tuple[int, int, int, int],
         costs: tuple[float | None, float | None, float | None], unpriced: int,
         explanation: str) -> dict[str, Any]:  # fmt: skip
    return {
        "day": day,
        "model": model,
        "provider_requests": requests[0],
        "record_requests": requests[1],
        "provider_input_tokens": tokens[0],
        "record_input_tokens": tokens[1],
        "provider_output_tokens": tokens[2],
        "record_output_tokens": tokens[3],
        "provider_cost_usd": costs[0],
        "record_cost_usd": costs[1],
        "difference_usd": costs[2],
        "record_unpriced": unpriced,
        "explanation": explanation,
    }


EXPECTED = [
    _row("2026-11-20", MINI, (1, 1), (1000, 1000, 1000, 1000), (0.0009, 0.00075, 0.00015), 0,
         "price drift: same requests and tokens, costs differ by $0.00015"),
    _row("2026-11-20", GPT5, (3, 2), (4000, 2000, 2000, 1000), (0.025, 0.0125, 0.0125), 0,
         "bypassed: 1 requests, 2000 input and 1000 output tokens the provider counted are "
         "not in the record"),
    _row("2026-11-20", "text-embedding-3-small", (1, 1), (1000, 1000, 0, 0),
         (0.00002, 0.00002, 0.0), 0, ""),
    _row("2026-11-21", GPT5, (1, 1), (1000, 1000, 500, 500), (0.00625, 0.00625, 0.0), 0, ""),
    _row("2026-11-21", "gpt-unknown-x", (1, 1), (100, 100, 50, 50), (0.001, None, 0.001), 1,
         "unpriced: 1 exchanges in the record have no cost"),
    _row("2026-11-21", "o3-2025-04-16", (2, 0), (300, 0, 200, 0), (0.0022, None, 0.0022), 0,
         "bypassed: 2 requests, 300 input and 200 output tokens the provider counted are "
         "not in the record"),
]  # fmt: skip


async def test_reconcile_shows_what_bypassed_the_proxy(
    provider: str, db_url: str, tmp_path: Path
) -> None:
    await upgrade(db_url)
    assert await dbs.store(db_url, RECORDED) == len(RECORDED)
    config = _config(tmp_path, provider, db_url)
    env = {"OPENAI_ADMIN_KEY": ADMIN_KEY}
    PAGES_SEEN.clear()
    since, until = "2026-11-20T00:00:00+00:00", "2026-11-22T00:00:00+00:00"
    args = ("reconcile", "--config", config, "--upstream", "openai", "--since", since,
            "--until", until)  # fmt: skip
    code, out, err = await flightrec(*args, "--format", "json", env=env)
    assert (code, err) == (0, "")
    assert orjson.loads(out) == EXPECTED
    assert sorted(PAGES_SEEN) == sorted(
        f"{kind}:{page}" for kind in ("completions", "embeddings", "costs") for page in (0, 1)
    )
    code, table, _ = await flightrec(*args, env=env)
    assert code == 0 and ADMIN_KEY not in table
    assert "bypassed: 2 requests" in table.splitlines()[-1]
    code, text, _ = await flightrec(*args, "--format", "csv", env=env)
    assert code == 0 and text.splitlines()[0].startswith("day,model,provider_requests")
    assert len(text.splitlines()) == 1 + len(EXPECTED)
    # Pruned days count through their rollups: the first day pruned, the same figures.
    prune = ("prune", "--config", config, "--before", "2026-11-21T00:00:00+00:00")
    code, said, _ = await flightrec(*prune, env={})
    assert code == 0 and said.startswith("pruned 4 exchanges"), said
    code, out, err = await flightrec(*args, "--format", "json", env=env)
    assert (code, err) == (0, "")
    assert orjson.loads(out) == EXPECTED


async def test_reconcile_without_the_admin_key_says_which_variable(
    provider: str, tmp_path: Path
) -> None:
    config = _config(tmp_path, provider, dbs.sqlite_url(tmp_path / "f.db"))
    code, out, err = await flightrec(
        "reconcile", "--config", config, "--admin-key-env", "MY_ADMIN_KEY", env={}
    )
    assert (code, out) == (1, "")
    assert err == "Error: set MY_ADMIN_KEY to the provider's admin key\n"


async def test_a_refused_admin_key_is_one_line_without_the_key(tmp_path: Path) -> None:
    async def refuse(request: web.Request) -> web.Response:
        error = {"message": "Incorrect API key provided.", "type": "invalid_request_error"}
        return web.json_response({"error": error}, status=401)

    app = web.Application()
    app.router.add_get("/v1/organization/usage/completions", refuse)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        url = await start_site(runner) + "/v1"
        db = dbs.sqlite_url(tmp_path / "f.db")
        await upgrade(db)
        config = _config(tmp_path, url, db)
        code, _, err = await flightrec(
            "reconcile", "--config", config, "--upstream", "openai",
            env={"OPENAI_ADMIN_KEY": ADMIN_KEY},
        )  # fmt: skip
    finally:
        await runner.cleanup()
    assert code == 1 and ADMIN_KEY not in err
    assert err.startswith("Error: the provider's report: ") and err.endswith(
        "/organization/usage/completions: 401 Incorrect API key provided.\n"
    )
