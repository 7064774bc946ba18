"""The command line's own behaviour: every usage error is one line on stderr, naming the flag
the user typed, with a non-zero exit (README: Commands)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from proxy.cli.main import main

USAGE_ERRORS = [
    (["serve", "--bogus"], "No such option '--bogus'"),
    (["serve", "--port", "eighty"], "'--port'"),
    (["logs", "--limit", "x"], "'--limit'"),
    (["logs", "--since", "yesterday-ish"], "--since"),
    (["nosuch"], "No such command 'nosuch'"),
    (["show"], "Missing argument 'ID'"),
    (["cost", "--since", "2h", "--until", "3h"], "--since must be earlier than --until"),
    (["cost", "--by", "colour"], "--by"),
    (["export", "--endpoint", "/v1/x"], "--endpoint"),
    (["db", "upgrade", "--bad"], "No such option '--bad'"),
    # Values checked by the config, given by flag: the message names the flag as typed.
    (["serve", "--db", "mysql://x"], "--db: expected a sqlite+aiosqlite://"),
    (["db", "upgrade", "--db", "mysql://x"], "--db: expected"),
    (["playback", "--db", "mysql://x"], "--db: expected"),
    (["serve", "--upstream", "ftp://x"], "--upstream: expected an http:// or https:// URL"),
    (["serve", "--port", "70000"], "--port: expected a port number"),
    (["console", "--port", "99999"], "--port: expected a port number"),
    (["console", "--port", "-5"], "--port: expected an integer >= 0"),
    (["console", "--host", ""], "--host: expected a non-empty string"),
    (["console", "--host", "0.0.0.0"], "--host: the console on 0.0.0.0 would be open"),
]


@pytest.mark.parametrize(
    ("args", "names"), USAGE_ERRORS, ids=[" ".join(a) for a, _ in USAGE_ERRORS]
)
def test_a_usage_error_is_one_line(args: list[str], names: str) -> None:
    env = {"FLIGHTREC_CONFIG": None, "FLIGHTREC_CONSOLE_TOKEN": None}
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code != 0
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ") and names in lines[0], lines[0]
    assert "--db-url" not in lines[0] and "--console-" not in lines[0]
    assert result.stdout == ""


def test_help_is_still_help() -> None:
    for args in (["--help"], ["serve", "--help"], ["db"]):
        result = CliRunner().invoke(main, args, prog_name="flightrec")
        assert "Usage: flightrec" in result.output, args
        assert "Error" not in result.output
