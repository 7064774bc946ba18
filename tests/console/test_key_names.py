"""`[keys]` names: checked at load, accepted by `cost --key`, shown by `cost --by key`."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

from proxy.config import ConfigError, load
from proxy.keynames import KeyNames
from tests import dbs
from tests.cli.test_cli_store import cli
from tests.console_data import console_app, write


async def test_cost_by_key_names_keys_and_filters_by_name(tmp_path: Path) -> None:
    url = dbs.sqlite_url(tmp_path / "keys.db")
    ci = dbs.chat_exchange(key_hash="a1" * 8, key_hint="sk-...aaaa")
    batch = dbs.chat_exchange(key_hash="3f9a" * 4, key_hint="sk-...bbbb", model="gpt-4o")
    await dbs.recorded(url, [ci, batch])
    config = tmp_path / "flightrec.toml"
    config.write_text(f'db_url = "{url}"\n[keys]\n"sk-...aaaa" = "ci-bot"\n"3f9a" = "batch"\n')
    run = await cli("cost", "--by", "key", "--format", "json", "--config", str(config))
    assert run.code == 0, run.err
    names = {row["key_hint"]: row["key_name"] for row in json.loads(run.out)}
    assert names == {"sk-...aaaa": "ci-bot", "sk-...bbbb": "batch"}
    table = await cli("cost", "--by", "key", "--config", str(config))
    assert "ci-bot (sk-...aaaa)" in table.out
    only = await cli("cost", "--key", "batch", "--format", "json", "--config", str(config))
    assert [row["group"] for row in json.loads(only.out)] == ["gpt-4o-2024-07-18"]


def test_a_bad_keys_entry_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[keys]\n"my key" = "x"\n')
    with pytest.raises(ConfigError, match=re.escape("keys.my key: expected a key hint")):
        load(config, env={})
    config.write_text('[keys]\n"sk-...a1b2" = 3\n')
    with pytest.raises(ConfigError, match=re.escape("keys.sk-...a1b2: expected a name")):
        load(config, env={})


def test_names_by_hint_or_hash_prefix() -> None:
    names = KeyNames({"sk-...a1b2": "ci", "3f9a": "batch"})
    assert names.name("ffff", "sk-...a1b2") == "ci"
    assert names.name("3f9a0c", "sk-...zzzz") == "batch"
    assert names.name("0000", None) is None
    assert names.resolve("batch") == "3f9a" and names.resolve("sk-...x") == "sk-...x"


async def test_two_keys_with_one_label_are_told_apart_on_the_overview(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    url = dbs.sqlite_url(tmp_path / "twins.db")
    first = dbs.chat_exchange(key_hash="a1" * 8, key_hint="sk-...aaaa")
    second = dbs.chat_exchange(key_hash="b2" * 8, key_hint="sk-...aaaa")
    other = dbs.chat_exchange(key_hash="c3" * 8, key_hint="sk-...cccc")
    near = dbs.chat_exchange(key_hash="a1" * 4 + "ff" * 4, key_hint="sk-...aaaa")  # 8 alike
    await write(url, [first, second, other, near])
    client = await aiohttp_client(console_app(url, keys={"sk-...aaaa": "ci-bot"}))
    page = await (await client.get("/")).text()
    top = page[page.index('<table class="top-key">') :]
    top = html.unescape(top[: top.index("</table>")])
    assert "ci-bot (sk-...aaaa) #a1a1a1a1a<" in top
    assert "ci-bot (sk-...aaaa) #a1a1a1a1f<" in top
    assert "ci-bot (sk-...aaaa) #b2b2b2b2b<" in top
    assert "sk-...cccc<" in top  # a label of its own stays as it was
