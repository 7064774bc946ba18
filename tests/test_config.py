"""Config: one table of keys, all documented, errors that name the key."""

from __future__ import annotations

import pickle
import re
import tomllib
from pathlib import Path

import pytest

from proxy.alert_rules import ALERT_KEYS, BUDGET_KEYS
from proxy.config import (
    KEYS,
    PRICE_KEYS,
    REDACT_KEYS,
    UPSTREAM_KEYS,
    Config,
    ConfigError,
    load,
)
from proxy.pricing import Prices
from proxy.usage import Usage

EXAMPLE = Path(__file__).resolve().parents[1] / "config.example.toml"
README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_key_is_documented_in_the_example() -> None:
    text = EXAMPLE.read_text()
    documented = set(re.findall(r"^#?\s*([a-z_]+) = ", text, flags=re.MULTILINE))
    assert set(KEYS) <= documented, f"undocumented: {set(KEYS) - documented}"
    assert set(UPSTREAM_KEYS) <= documented
    assert set(PRICE_KEYS) <= documented
    assert set(REDACT_KEYS) <= documented
    assert re.search(r'^#?\s*\[prices\."[^"]+"\]$', text, flags=re.MULTILINE), "no [prices.x]"
    assert re.search(r"^# \[\[redact\]\]$", text, flags=re.MULTILINE), "no [[redact]]"
    assert set(ALERT_KEYS) | set(BUDGET_KEYS) <= documented
    for table in ("alerts", "budgets"):
        assert re.search(rf"^# \[\[{table}\]\]$", text, flags=re.MULTILINE), f"no [[{table}]]"
    known = set(KEYS) | set(UPSTREAM_KEYS) | set(PRICE_KEYS) | set(REDACT_KEYS)
    known |= set(ALERT_KEYS) | set(BUDGET_KEYS)
    assert documented <= known, f"the example names unknown keys: {documented - known}"


def test_every_key_is_in_the_readme_table() -> None:
    section = README.read_text().split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = {name for row in rows for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])}
    assert set(KEYS) <= named, f"not in the README's configuration table: {set(KEYS) - named}"
    assert named <= set(KEYS), f"the README's table names unknown keys: {named - set(KEYS)}"
    assert any("`[[upstreams]]`" in row for row in rows), "no [[upstreams]] row"
    assert any("`[prices." in row for row in rows), "no [prices] row"
    assert any("`[[redact]]`" in row for row in rows), "no [[redact]] row"


def test_the_example_loads_to_the_defaults() -> None:
    assert load(EXAMPLE, env={}) == Config()
    assert set(tomllib.loads(EXAMPLE.read_text())) == set(KEYS) | {"upstreams"}


def test_file_then_env_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('port = 9000\nhost = "0.0.0.0"\nread_timeout = 5\n')
    config = load(path, env={"FLIGHTREC_PORT": "9100", "FLIGHTREC_STREAM_USAGE": "passthrough"})
    assert (config.port, config.host, config.stream_usage) == (9100, "0.0.0.0", "passthrough")
    assert config.read_timeout == 5.0
    config = load(path, env={"FLIGHTREC_PORT": "9100"}, overrides={"port": 9200, "host": None})
    assert (config.port, config.host) == (9200, "0.0.0.0")


def test_config_file_from_environment(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("batch_size = 7\n")
    assert load(None, env={"FLIGHTREC_CONFIG": str(path)}).batch_size == 7


def test_upstreams_and_their_default_prefixes(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[[upstreams]]\nname = "a"\nbase_url = "http://127.0.0.1:1/v1/"\n'
        '[[upstreams]]\nname = "groq"\nbase_url = "https://api.groq.com/openai/v1"\n'
    )
    a, groq = load(path, env={}).upstreams
    assert (a.prefix, a.base_url) == ("/v1", "http://127.0.0.1:1/v1")
    assert groq.prefix == "/groq/v1"
    moved = load(path, env={"FLIGHTREC_UPSTREAM": "http://127.0.0.1:2/v1"}).upstreams
    assert moved[0].base_url == "http://127.0.0.1:2/v1" and moved[1] == groq


@pytest.mark.parametrize(
    ("text", "env", "names"),
    [
        ("prot = 1\n", {}, "prot"),
        ('port = "high"\n', {}, "port"),
        ("port = 70000\n", {}, "port"),
        ('db_url = "mysql://x"\n', {}, "db_url"),
        ('stream_usage = "always"\n', {}, "stream_usage"),
        ("read_timeout = -1\n", {}, "read_timeout"),
        ("", {"FLIGHTREC_PORT": "eighty"}, "FLIGHTREC_PORT"),
        ("", {"FLIGHTREC_AUTO_UPGRADE": "maybe"}, "FLIGHTREC_AUTO_UPGRADE"),
        ('[[upstreams]]\nname = "a"\nbase_url = "ftp://x"\n', {}, "upstreams[0].base_url"),
        ('[[upstreams]]\nname = "a"\nbase_url = "http://x"\nurl = 1\n', {}, "upstreams[0].url"),
        (
            '[[upstreams]]\nname = "a"\nbase_url = "http://x"\n'
            '[[upstreams]]\nname = "a"\nbase_url = "http://y"\n',
            {},
            "upstreams",
        ),
        ("port = \n", {}, "not valid TOML"),
        ('[prices."gpt-4o"]\ninput = "cheap"\n', {}, "prices.gpt-4o.input"),
        ('[prices."gpt-4o"]\ninptu = 1\n', {}, "prices.gpt-4o.inptu"),
        ('[prices."our-model"]\ninput = 1\n', {}, "prices.our-model.output"),
        ("prices = 1\n", {}, "prices"),
    ],
)
def test_errors_name_the_key(tmp_path: Path, text: str, env: dict[str, str], names: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load(path, env=env)
    assert names in str(info.value)


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load(tmp_path / "nope.toml", env={})


def test_the_example_prices_load_and_apply(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    commented = text[text.index('# [prices."') :]
    path = tmp_path / "c.toml"
    path.write_text("\n".join(line.removeprefix("#").strip() for line in commented.splitlines()))
    config = load(path, env={})
    prices = config.prices
    assert set(prices) == {"gpt-4o", "llama3:8b"}
    assert pickle.loads(pickle.dumps(config)) == config  # serve --workers sends it over
    with pytest.raises(TypeError):
        prices["gpt-4o"]["input"] = 1  # type: ignore[index]
    table = Prices(prices)
    usage = Usage(1_000_000, 0, 0, 0, 0, 0, 0, 1_000_000, 0, 0, 0)
    # The config entry wins over genai-prices' gpt-4o, for its dated snapshots too.
    assert table.price(usage, "gpt-4o-2024-08-06") == (12.5, "config gpt-4o")
    assert table.price(usage, "llama3:8b") == (0.0, "config llama3:8b")
    assert table.price(usage, "llama3") is None


def test_price_keys_are_the_fields_the_price_table_takes() -> None:
    with pytest.raises(ValueError) as info:
        Prices({"m": {"input": 1, "output": 1, "bogus": 1}})
    assert str(info.value).endswith(f"(known: {', '.join(sorted(PRICE_KEYS))})")


def test_an_upstream_names_a_known_provider(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    upstream = '[[upstreams]]\nname = "g"\nbase_url = "http://127.0.0.1:9/v1"\n'
    path.write_text(upstream + 'provider = "groq"\n')
    assert load(path, env={}).upstreams[0].provider == "groq"
    path.write_text(upstream + 'provider = "none"\n')
    assert load(path, env={}).upstreams[0].provider == "none"
    path.write_text(upstream + 'provider = "grok"\n')
    with pytest.raises(ConfigError, match=r"^upstreams\.g\.provider: unknown provider 'grok'"):
        load(path, env={})
    path.write_text(upstream + "provider = 3\n")
    with pytest.raises(ConfigError, match=r"^upstreams\[0\]\.provider: expected"):
        load(path, env={})


def test_only_the_value_that_wins_is_read(tmp_path: Path) -> None:
    """A flag stands in for a bad value in the environment (or the file) without an error; the
    bad value is still an error when it wins, named where it was given."""
    path = tmp_path / "c.toml"
    path.write_text('port = "soon"\n')
    env = {"FLIGHTREC_DB_URL": "bogus", "FLIGHTREC_PORT": "9100"}
    url = f"sqlite+aiosqlite:///{tmp_path / 'a.db'}"
    config = load(path, env=env, overrides={"db_url": url})
    assert (config.db_url, config.port) == (url, 9100)
    with pytest.raises(ConfigError, match="FLIGHTREC_DB_URL"):
        load(path, env=env)
    with pytest.raises(ConfigError, match="port"):
        load(path, env={}, overrides={"db_url": url})
