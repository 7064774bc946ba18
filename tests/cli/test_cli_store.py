"""`flightrec db upgrade`, `logs`, `show` and the `--db` flag as a user runs them: `python -m
proxy` in a subprocess, against a real SQLite file (and PostgreSQL when available)."""

from __future__ import annotations

import asyncio
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import orjson

from proxy.store.migrate import head
from tests import dbs
from tests.dbs import chat_exchange, recorded, sqlite_url

pg_url = dbs.pg_url  # fixture


@dataclass
class Run:
    code: int
    out: str
    err: str

    def one_line_error(self) -> str:
        """The error, after checking it is exactly one line and no traceback."""
        assert self.code != 0
        assert "Traceback" not in self.err
        lines = self.err.strip().splitlines()
        assert len(lines) == 1, self.err
        return lines[0]


async def cli(*args: str, db_url: str | None = None, cwd: Path | None = None) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}
    if db_url is not None:
        env["FLIGHTREC_DB_URL"] = db_url
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", *args,
        env=env, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return Run(process.returncode, out.decode(), err.decode())


async def test_upgrade_then_logs_and_show(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "cli.db")
    upgraded = await cli("db", "upgrade", db_url=url)
    assert upgraded.code == 0, upgraded.err
    assert f"schema at {head()}" in upgraded.out

    older = chat_exchange(started_at=1_700_000_000.0, tags={"team": "a"}, user="u-1")
    newer = chat_exchange(model="gpt-4o", logprobs=["a", "b"])
    await recorded(url, [older, newer])

    # --config works as well as FLIGHTREC_DB_URL.
    config = tmp_path / "flightrec.toml"
    config.write_text(f'db_url = "{url}"\n')
    listed = await cli("logs", "--json", "--config", str(config))
    assert listed.code == 0, listed.err
    assert [s["id"] for s in orjson.loads(listed.out)] == [newer.id, older.id]

    filtered = await cli("logs", "--json", "--tag", "team=a", "--since", "2023-01-01", db_url=url)
    assert [s["id"] for s in orjson.loads(filtered.out)] == [older.id]

    table = await cli("logs", "--model", "gpt-4o", db_url=url)
    assert table.code == 0 and newer.id in table.out and older.id not in table.out
    assert table.out.splitlines()[0].split()[:4] == ["STARTED", "(UTC)", "ID", "MODEL"]

    shown = await cli("show", newer.id, "--json", db_url=url)
    assert shown.code == 0, shown.err
    obj = orjson.loads(shown.out)
    for key in (
        "id", "status", "outcome", "stream", "upstream", "model", "request", "response",
        "usage", "usage_source", "cost_usd", "tags", "user", "key_hint", "replay_of",
        "started_at", "ttfb_ms", "ttft_ms", "duration_ms",
    ):  # fmt: skip
        assert key in obj, key
    assert obj["request"] == newer.request_json
    assert obj["response"] == newer.response_json
    assert (obj["status"], obj["upstream"], obj["usage"]) == (200, "openai", newer.usage)

    readable = await cli("show", older.id[:28], db_url=url)  # a unique prefix
    assert readable.code == 0, readable.err
    assert older.id in readable.out and "--- response ---" in readable.out
    assert "team=a" in readable.out and "u-1" in readable.out


async def test_db_flag_names_the_database_over_the_environment(tmp_path: Path) -> None:
    """`--db` works on every command that reads the record, as on `serve`, and wins over
    FLIGHTREC_DB_URL (here a second database that holds nothing)."""
    holds, empty = sqlite_url(tmp_path / "holds.db"), sqlite_url(tmp_path / "empty.db")
    for url in (holds, empty):
        assert (await cli("db", "upgrade", "--db", url)).code == 0
    stored = chat_exchange()
    await recorded(holds, [stored])

    listed = await cli("logs", "--json", "--db", holds, db_url=empty)
    assert [s["id"] for s in orjson.loads(listed.out)] == [stored.id], listed.err
    shown = await cli("show", stored.id, "--json", "--db", holds, db_url=empty)
    assert orjson.loads(shown.out)["id"] == stored.id, shown.err
    spent = await cli("cost", "--format", "json", "--db", holds, db_url=empty)
    assert [row["requests"] for row in orjson.loads(spent.out)] == [1], spent.err
    exported = await cli("export", "--db", holds, db_url=empty)
    assert [orjson.loads(line)["id"] for line in exported.out.splitlines()] == [stored.id]

    # The other way round, each command looks where --db says and finds nothing there.
    assert orjson.loads((await cli("logs", "--json", "--db", empty, db_url=holds)).out) == []
    for args in (("show", stored.id), ("replay", stored.id)):
        error = (await cli(*args, "--db", empty, db_url=holds)).one_line_error()
        assert error == f"Error: no exchange with id '{stored.id}'", args


async def test_show_unknown_id_is_one_line(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "cli.db")
    assert (await cli("db", "upgrade", db_url=url)).code == 0
    error = (await cli("show", "0190ffff-dead-7000-8000-000000000000", db_url=url)).one_line_error()
    assert error == "Error: no exchange with id '0190ffff-dead-7000-8000-000000000000'"


async def test_unreachable_database_is_one_line() -> None:
    url = "postgresql+asyncpg://nobody@127.0.0.1:9/flightrec"
    for args in (("logs",), ("show", "x"), ("db", "upgrade")):
        error = (await cli(*args, db_url=url)).one_line_error()
        assert error.startswith("Error: cannot connect to the database at "), error
        assert "127.0.0.1:9" in error


async def test_missing_or_unmigrated_sqlite_file_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    error = (await cli("logs", db_url=sqlite_url(missing))).one_line_error()
    assert error == f"Error: no database file at {missing}"
    assert not missing.exists()  # reading never creates a database

    empty = tmp_path / "empty.db"
    empty.touch()
    error = (await cli("show", "x", db_url=sqlite_url(empty))).one_line_error()
    assert "schema revision none" in error and "flightrec db upgrade" in error


async def test_bad_flags_are_usage_errors_without_traceback(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "cli.db")
    for args, message in (
        (("logs", "--since", "yesterday"), "Invalid value for '--since'"),
        (("logs", "--tag", "novalue"), "Invalid value for '--tag'"),
        (("logs", "--limit", "0"), "Invalid value for '--limit'"),
    ):
        run = await cli(*args, db_url=url)
        assert run.code == 2 and message in run.err and "Traceback" not in run.err


async def test_a_time_out_of_range_is_a_usage_error_naming_the_flag(tmp_path: Path) -> None:
    """An age or date beyond what a datetime holds (OverflowError inside) is one line naming
    the flag, for every command that takes a time."""
    url = sqlite_url(tmp_path / "cli.db")
    for args in (
        ("logs", "--since"),
        ("cost", "--since"),
        ("cost", "--until"),
        ("export", "--since"),
        ("export", "--until"),
        ("replay", "--since"),
        ("prune", "--dry-run", "--before"),
    ):
        for when in ("99999999d", "0001-01-01T00:00+01:00"):
            run = await cli(*args, when, db_url=url)
            flag = args[-1]
            assert run.code == 2 and f"Invalid value for '{flag}'" in run.err, (args, run.err)
            assert "Traceback" not in run.err and "out of range" in run.err, (args, run.err)


async def test_upgrade_and_show_on_postgres(pg_url: str) -> None:
    assert (await cli("db", "upgrade", db_url=pg_url)).code == 0
    ex = chat_exchange(stream=True)
    await recorded(pg_url, [ex])
    shown = await cli("show", ex.id, "--json", db_url=pg_url)
    assert shown.code == 0, shown.err
    obj = orjson.loads(shown.out)
    assert obj["response"] == ex.response_json and obj["stream"] is True
