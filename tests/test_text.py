"""Recorded text printed by the CLI cannot drive the terminal (`proxy/text.py`): `logs`,
`show`, `cost` and `replay`'s comparison show control characters as visible escapes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
from click.testing import CliRunner

from proxy.cli.main import main
from proxy.store import create_engine
from proxy.store.read import get_exchange
from proxy.tools.compare import compare, render
from tests.dbs import chat_exchange, recorded, sqlite_url

CLIPBOARD = "\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGV8c2gK\x07"  # OSC 52: write the clipboard
TITLE = "\x1b]0;pwned\x07"  # OSC 0: set the window title
HOSTILE = [CLIPBOARD, TITLE, "\x1b[2J", "\x9b31m", "\r", "\x07"]
SHOWN = ["\\x1b]52;c;", "\\x07", "\\x1b]0;pwned", "\\x1b[2J", "\\x9b31m", "\\x0d"]


async def hostile_record(url: str) -> str:
    ex = chat_exchange(
        model=f"m{CLIPBOARD}x",
        content=f"hi{TITLE}\x9b2J there\rover",
        user=f"u\x9b31m{TITLE}",
        tags={"team": "a\rb\x1b[2J"},
    )
    ex.error = f"boom{CLIPBOARD}\r"
    await recorded(url, [ex])
    return ex.id


def flightrec(url: str, *args: str) -> str:
    # color=True: click would otherwise strip CSI colour codes itself, as off a terminal.
    result = CliRunner().invoke(main, list(args), env={"FLIGHTREC_DB_URL": url}, color=True)
    assert result.exit_code == 0, result.output
    return result.stdout


def assert_safe(out: str) -> None:
    controls = {c for c in out if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) < 0xA0}
    assert not controls, controls
    for escaped in SHOWN:
        assert escaped in out, (escaped, out)


async def test_logs_show_and_cost_escape_recorded_controls(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "hostile.db")
    exchange_id = await hostile_record(url)

    for args in (["logs"], ["show", exchange_id], ["cost", "--by", "model"]):
        out = await asyncio.to_thread(flightrec, url, *args)
        if args[0] == "cost":  # groups only the model, the one hostile field it shows
            assert "m\\x1b]52;c;Y3VybCBldmlsLmV4YW1wbGV8c2gK\\x07x" in out
            assert not [c for c in out if ord(c) < 0x20 and c != "\n"]
            continue
        assert_safe(out)
    table = await asyncio.to_thread(flightrec, url, "cost", "--by", "tag:team")
    assert "a\\x0db\\x1b[2J" in table


async def test_json_output_escapes_every_control(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "hostile.db")
    exchange_id = await hostile_record(url)
    for args in (["logs", "--json"], ["show", exchange_id, "--json"]):
        out = await asyncio.to_thread(flightrec, url, *args)
        assert not [c for c in out if (ord(c) < 0x20 and c not in "\n") or 0x7F <= ord(c) < 0xA0]
        shown = orjson.loads(out)
        record = shown[0] if isinstance(shown, list) else shown
        assert record["user"] == f"u\x9b31m{TITLE}"  # the same text, only escaped


async def test_replay_comparison_escapes_recorded_controls(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "hostile.db")
    exchange_id = await hostile_record(url)
    engine = create_engine(url)
    try:
        shown = await get_exchange(engine, exchange_id)
    finally:
        await engine.dispose()
    replayed = {**shown, "response": chat_exchange(content="plain").response_json}
    out = render([compare(shown, replayed)])
    assert "\x1b" not in out and "\x9b" not in out and "\r" not in out
    assert "\\x1b]0;pwned\\x07" in out


def test_json_columns_take_text_keys_other_keys_and_big_ints() -> None:
    """`text.dumps` (every JSON column): the plain path, non-text keys and ints orjson
    refuses each give the JSON they are."""
    from proxy.text import dumps

    top = [{"token": "Hé", "logprob": -0.25, "bytes": [72, 195, 169]}]
    assert orjson.loads(dumps(top)) == top
    assert dumps({1: "a", "b": None}) == '{"1":"a","b":null}'
    assert orjson.loads(dumps({"n": 2**70})) == {"n": 2**70}
