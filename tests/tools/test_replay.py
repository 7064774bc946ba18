"""`replay`: stored requests re-sent through the proxy's own forwarding path against a real
(fake) upstream, recorded as new exchanges linked to their originals, and compared."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from proxy.config import Upstream
from proxy.store.browse import list_exchanges
from proxy.store.filters import Filters
from proxy.store.read import get_exchange, reading
from proxy.tools.replay import ReplayError, ReplayOptions, replay
from tests import dbs
from tests.conftest import FakeUpstream, reserved_port
from tests.recordings import KEY, answer_by_model, cli, config_for, fake_upstream, record_two

db_url = dbs.db_url  # fixture
ENV = {"OPENAI_API_KEY": KEY}


async def test_replay_of_stream_and_plain_is_new_linked_and_same(
    upstream: FakeUpstream, db_url: str, tmp_path: Path
) -> None:
    answer_by_model(upstream)
    config = config_for(db_url, upstream.url, tmp_path)
    recorded = await record_two(config)
    upstream.seen.clear()

    comparisons = await replay(
        config, [recorded.stream_id, recorded.plain_id[:13]], ReplayOptions(), env=ENV
    )

    assert [c["original"] for c in comparisons] == [recorded.stream_id, recorded.plain_id]
    for c in comparisons:
        assert c["replay"] not in (recorded.stream_id, recorded.plain_id)
        assert (c["same_content"], c["same_tool_calls"], c["same_finish_reason"]) == (True,) * 3
        assert c["fingerprint_changed"] is False and c["diff"] == ""
        assert c["usage_delta"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        assert isinstance(c["latency_delta_ms"], float)
        assert (c["status"], c["outcome"]) == (200, "ok")
    # The key came from the environment and went upstream; no control header did.
    assert len(upstream.seen) == 2
    for seen in upstream.seen:
        assert seen.headers["Authorization"] == f"Bearer {KEY}"
        assert not any(name.lower().startswith("x-flightrec") for name in seen.headers)
    async with reading(db_url) as engine:
        for c in comparisons:
            original = await get_exchange(engine, c["original"])
            again = await get_exchange(engine, c["replay"])
            assert again["replay_of"] == original["id"] and original["replay_of"] is None
            assert (again["request"], again["stream"]) == (original["request"], original["stream"])
            assert again["response"]["choices"] == original["response"]["choices"]
            assert again["key_hint"] == original["key_hint"]
        assert len(await list_exchanges(engine)) == 4


async def test_replay_on_another_model_shows_the_diff(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    answer_by_model(upstream)
    url = dbs.sqlite_url(tmp_path / "r.db")
    recorded = await record_two(config_for(url, upstream.url, tmp_path))
    env = {**ENV, "FLIGHTREC_DB_URL": url, "FLIGHTREC_UPSTREAM": upstream.url}

    run = await cli(
        "replay", recorded.stream_id, "--model", "gpt-4o", "--json", env=env, cwd=tmp_path
    )
    assert run.code == 0, run.err
    [c] = orjson.loads(run.out)
    assert c["original"] == recorded.stream_id
    assert (c["same_content"], c["same_finish_reason"], c["fingerprint_changed"]) == (
        False,
        True,
        True,
    )
    assert (c["original_model"], c["replay_model"]) == (
        "gpt-4o-mini-2024-07-18",
        "gpt-4o-2024-08-06",
    )
    assert c["usage_delta"] == {"prompt_tokens": 0, "completion_tokens": 2, "total_tokens": 2}
    assert "-Blue.\n" in c["diff"] and "+Green.\n" in c["diff"]
    for key in ("same_tool_calls", "cost_delta_usd", "latency_delta_ms", "replay"):
        assert key in c

    # The readable form: the text diff of the content; and --no-stream turns streaming off.
    run = await cli(
        "replay", recorded.stream_id, "--model", "gpt-4o", "--no-stream", env=env, cwd=tmp_path
    )
    assert run.code == 0, run.err
    assert "content DIFFERS" in run.out
    assert "--- original\n+++ replay\n" in run.out and "-Blue.\n+Green.\n" in run.out
    async with reading(url) as engine:
        newest = (await list_exchanges(engine, limit=1))[0]
        shown = await get_exchange(engine, newest["id"])
    assert shown["replay_of"] == recorded.stream_id and shown["stream"] is False
    assert "stream" not in shown["request"] and shown["request"]["model"] == "gpt-4o"


async def test_replay_to_another_upstream(upstream: FakeUpstream, tmp_path: Path) -> None:
    answer_by_model(upstream)
    config = config_for(dbs.sqlite_url(tmp_path / "r.db"), upstream.url, tmp_path)
    recorded = await record_two(config)
    async with fake_upstream() as other:
        second = Upstream("local", other.url, "/local/v1", "LOCAL_KEY")
        config = replace(config, upstreams=(*config.upstreams, second))
        options = ReplayOptions(upstream="local")
        with pytest.raises(ReplayError, match=r"set \$LOCAL_KEY"):
            await replay(config, [recorded.plain_id], options, env=ENV)
        [c] = await replay(config, [recorded.plain_id], options, env={"LOCAL_KEY": "sk-local"})
    assert [s.path_qs for s in other.seen] == ["/v1/chat/completions"]
    assert other.seen[0].headers["Authorization"] == "Bearer sk-local"
    assert c["same_content"] is False  # the other upstream answers with its own completion
    async with reading(config.db_url) as engine:
        assert (await get_exchange(engine, c["replay"]))["upstream"] == "local"


async def test_replay_while_the_upstream_fails(
    upstream: FakeUpstream, db_url: str, tmp_path: Path
) -> None:
    answer_by_model(upstream)
    config = config_for(db_url, upstream.url, tmp_path)
    recorded = await record_two(config)
    async with reading(db_url) as engine:
        before = [await get_exchange(engine, i) for i in (recorded.stream_id, recorded.plain_id)]

    async def overloaded(request: web.Request) -> web.Response:
        error = {"error": {"message": "overloaded", "type": "server_error", "param": None}}
        return web.json_response(error, status=503)

    upstream.override = overloaded
    failed = await replay(config, [recorded.stream_id], ReplayOptions(), env=ENV)
    with reserved_port() as port:  # nothing listens there
        gone = replace(
            config, upstreams=(Upstream("openai", f"http://127.0.0.1:{port}/v1", "/v1"),)
        )
        unreachable = await replay(gone, [recorded.plain_id], ReplayOptions(), env=ENV)

    assert [(c["status"], c["outcome"]) for c in failed + unreachable] == [
        (503, "upstream_error"),
        (502, "upstream_error"),
    ]
    assert failed[0]["error"] == "overloaded" and "unreachable" in unreachable[0]["error"]
    assert not failed[0]["same_content"] and not unreachable[0]["same_content"]
    async with reading(db_url) as engine:
        for c in failed + unreachable:
            shown = await get_exchange(engine, c["replay"])
            assert (shown["replay_of"], shown["outcome"]) == (c["original"], "upstream_error")
        after = [await get_exchange(engine, i) for i in (recorded.stream_id, recorded.plain_id)]
    assert after == before


async def test_replay_selected_by_filter_skips_replays(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    answer_by_model(upstream)
    config = config_for(dbs.sqlite_url(tmp_path / "r.db"), upstream.url, tmp_path)
    recorded = await record_two(config)
    select = Filters(limit=10, requested_model="gpt-4o-mini", originals_only=True)
    options = ReplayOptions(concurrency=2)
    first = await replay(config, [], options, filters=select, env=ENV)
    second = await replay(config, [], options, filters=select, env=ENV)
    originals = [recorded.stream_id, recorded.plain_id]
    assert [c["original"] for c in first] == [c["original"] for c in second] == originals
    assert all(c["same_content"] for c in first + second)


async def test_cli_errors_are_one_line(upstream: FakeUpstream, tmp_path: Path) -> None:
    answer_by_model(upstream)
    url = dbs.sqlite_url(tmp_path / "r.db")
    recorded = await record_two(config_for(url, upstream.url, tmp_path))
    env = {"FLIGHTREC_DB_URL": url, "FLIGHTREC_UPSTREAM": upstream.url}
    cases = [
        ((recorded.plain_id,), env, "OPENAI_API_KEY"),
        ((recorded.plain_id, "--upstream", "nope"), {**env, **ENV}, "no upstream named 'nope'"),
        (("0190aaaa-0000-7000-8000-000000000000",), {**env, **ENV}, "no exchange with id"),
    ]
    for args, run_env, expected in cases:
        run = await cli("replay", *args, env=run_env, cwd=tmp_path)
        assert run.code == 1 and "Traceback" not in run.err, run.err
        assert len(run.err.strip().splitlines()) == 1 and expected in run.err, run.err
    for args, expected in (
        ((), "give exchange IDs, or select with"),
        ((recorded.plain_id, "--since", "1h"), "give exchange IDs, or select with"),
        (("--tag", "novalue"), "Invalid value for '--tag'"),
    ):
        run = await cli("replay", *args, env={**env, **ENV}, cwd=tmp_path)
        assert run.code == 2 and expected in run.err and "Traceback" not in run.err, run.err
    async with reading(url) as engine:
        assert len(await list_exchanges(engine)) == 2  # nothing was sent


async def test_replay_carries_the_originals_tags_and_user(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    answer_by_model(upstream)
    config = config_for(dbs.sqlite_url(tmp_path / "r.db"), upstream.url, tmp_path)
    headers = {"X-Flightrec-Tag-Team": "red", "X-Flightrec-Tag-env": "prod eu",
               "X-Flightrec-User": "user-42"}  # fmt: skip
    recorded = await record_two(config, headers)
    comparisons = await replay(config, [recorded.stream_id], ReplayOptions(), env=ENV)
    async with reading(config.db_url) as engine:
        original = await get_exchange(engine, recorded.stream_id)
        again = await get_exchange(engine, comparisons[0]["replay"])
    assert original["tags"] == {"team": "red", "env": "prod eu"}
    assert (again["tags"], again["user"]) == (original["tags"], "user-42")
    assert not any(name.lower().startswith("x-flightrec") for name in upstream.seen[-1].headers)
