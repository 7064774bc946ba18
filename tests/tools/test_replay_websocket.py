"""`replay` of WebSocket responses: one of the Responses API's WebSocket mode is re-sent over
HTTP as the streamed `POST /v1/responses` it stands for; a Realtime one is refused, saying
why."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from proxy.relay.app import build_app, make_runner
from proxy.store import upgrade
from proxy.store.browse import list_exchanges
from proxy.store.read import get_exchange, reading
from proxy.store.recorder import DatabaseRecorder
from proxy.tools.replay import ReplayError, ReplayOptions, replay
from tests import dbs
from tests.conftest import start_site
from tests.recordings import KEY, config_for
from tests.wsfake import ws_upstream

db_url = dbs.db_url  # fixture


async def test_a_responses_websocket_turn_replays_over_http(db_url: str, tmp_path: Path) -> None:
    async with ws_upstream() as fake:
        config = config_for(db_url, fake.url + "/v1", tmp_path)
        await upgrade(db_url)
        app = build_app(config, DatabaseRecorder(config))
        runner = make_runner(app, config)
        await runner.setup()
        client = openai.AsyncOpenAI(base_url=await start_site(runner) + "/v1", api_key=KEY)
        async with client.responses.connect() as connection:
            await connection.response.create(model="gpt-4.1", input="Hello")
            while (await connection.recv()).type != "response.completed":
                pass
        async with client.realtime.connect(model="gpt-realtime") as connection:
            await connection.response.create(response={"instructions": "text"})
            while (await connection.recv()).type != "response.done":
                pass
        await client.close()
        await runner.cleanup()
        async with reading(db_url) as engine:
            by_method = {item["method"]: item["id"] for item in await list_exchanges(engine)}

        [compared] = await replay(
            config, [by_method["POST"]], ReplayOptions(), env={"OPENAI_API_KEY": KEY}
        )
        with pytest.raises(ReplayError, match="Realtime WebSocket response cannot be re-sent"):
            await replay(config, [by_method["WS"]], ReplayOptions(), env={"OPENAI_API_KEY": KEY})

    assert (compared["status"], compared["outcome"]) == (200, "ok")
    async with reading(db_url) as engine:
        original = await get_exchange(engine, by_method["POST"])
        again = await get_exchange(engine, compared["replay"])
    assert (again["method"], again["path"], again["stream"]) == ("POST", "/v1/responses", True)
    assert (
        again["request"]
        == original["request"]
        == {
            "model": "gpt-4.1",
            "input": "Hello",
            "stream": True,
        }
    )
    assert again["response"]["output"] == original["response"]["output"]
    assert again["usage"] == original["usage"]
    assert again["replay_of"] == original["id"]
