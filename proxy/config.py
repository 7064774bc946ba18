"""Configuration: TOML file, then `FLIGHTREC_*` environment, then command-line flags.

Every key is declared once in `KEYS`; `config.example.toml` documents each of them (a test
checks it). Validation happens at start and every error names the key it is about.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from proxy.pricing import CONFIG_FIELDS, UPDATE_URL, Prices, upstream_providers
from proxy.privacy.redact import RedactRule, parse_rules

DEFAULT_DB_URL = "sqlite+aiosqlite:///flightrec.db"
DEFAULT_UPSTREAM = "https://api.openai.com/v1"


class ConfigError(Exception):
    """A configuration problem; the message names the key."""


class Frozen(Mapping[str, Any]):
    """A read-only mapping that pickles (`serve --workers` sends the config to its processes),
    which `types.MappingProxyType` does not."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any] | None = None) -> None:
        self._data = dict(data or {})

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"Frozen({self._data!r})"


@dataclass(frozen=True, slots=True)
class Upstream:
    name: str
    base_url: str
    prefix: str
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the key `replay` sends (keys are never stored)."""
    provider: str | None = None
    """The genai-prices provider whose prices apply (`none`: none); None: by `base_url`."""


@dataclass(frozen=True, slots=True)
class Config:
    host: str = "127.0.0.1"
    port: int = 8080
    workers: int = 1
    db_url: str = DEFAULT_DB_URL
    auto_upgrade: bool = True
    stream_usage: str = "inject"
    cancel_on_disconnect: bool = True
    connect_timeout: float = 10.0
    read_timeout: float = 600.0
    client_header_timeout: float = 30.0
    keepalive_timeout: float = 75.0
    max_request_bytes: int = 64 * 1024 * 1024
    client_body_timeout: float = 60.0
    max_record_bytes: int = 16 * 1024 * 1024
    max_stream_record_bytes: int = 16 * 1024 * 1024
    store_raw_stream: bool = True
    shutdown_grace: float = 30.0
    queue_size: int = 10_000
    batch_size: int = 500
    batch_interval: float = 0.05
    spool_path: str = "flightrec.spool"
    journal_max_bytes: int = 1024**3
    log_level: str = "info"
    console_host: str = "127.0.0.1"
    console_port: int = 8081
    """0: `serve` runs no console."""
    console_token: str | None = field(default=None, repr=False)
    """Needed by every console route when set; required off loopback. Never logged."""
    upstreams: tuple[Upstream, ...] = field(
        default_factory=lambda: (Upstream("openai", DEFAULT_UPSTREAM, "/v1"),)
    )
    metrics_labels: tuple[str, ...] = ()
    """Labels added to the request, token and cost counters: `user`, `key`."""
    otlp_endpoint: str | None = None
    """OTLP/HTTP traces URL; None: no traces are sent."""
    otlp_headers: Mapping[str, str] = field(default_factory=Frozen, repr=False)
    """Headers sent with every export (often a collector's API key: never logged)."""
    otlp_content: bool = False
    store_bodies: str = "full"
    redact: tuple[RedactRule, ...] = ()
    """`[[redact]]` rules, in order (`proxy.privacy.redact`)."""
    retention_days: int = 0
    """Exchanges older than this many days are pruned (usage and cost kept in rollups); 0:
    kept forever."""
    retention_bodies_days: int = 0
    """Bodies (and choices, logprobs, raw streams) older than this many days are dropped; 0:
    kept as long as their exchange."""
    prices: Mapping[str, Mapping[str, Any]] = field(default_factory=Frozen)
    """`[prices."<model>"]` tables as written (USD per 1M tokens), read-only; they win over
    genai-prices (`proxy.pricing.Prices`)."""
    price_update: bool = False
    """Refresh genai-prices' data in the background (no outbound call for prices when off)."""
    price_update_url: str = UPDATE_URL


@dataclass(frozen=True, slots=True)
class Key:
    parse: Callable[[str, Any], Any]
    doc: str


def _int(key: str, value: Any, minimum: int = 0) -> int:
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def _port(key: str, value: Any) -> int:
    port = _int(key, value)
    if port > 65535:
        raise ConfigError(f"{key}: expected a port number 0-65535, got {port}")
    return port


def _positive_int(key: str, value: Any) -> int:
    return _int(key, value, minimum=1)


def _seconds(key: str, value: Any) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"{key}: expected a number of seconds, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"{key}: expected a positive number of seconds, got {value!r}")
    return float(value)


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def _str(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: expected a non-empty string, got {value!r}")
    return value


def _choice(*choices: str) -> Callable[[str, Any], str]:
    def parse(key: str, value: Any) -> str:
        if value not in choices:
            raise ConfigError(f"{key}: expected one of {', '.join(choices)}, got {value!r}")
        return str(value)

    return parse


def _optional_str(key: str, value: Any) -> str | None:
    """A string, or "" for none."""
    if value == "":
        return None
    return _str(key, value)


def _db_url(key: str, value: Any) -> str:
    url = _str(key, value)
    if not url.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
        raise ConfigError(
            f"{key}: expected a sqlite+aiosqlite:// or postgresql+asyncpg:// URL, got {url!r}"
        )
    return url


def _http_url(key: str, value: Any) -> str:
    url = _str(key, value)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{key}: expected an http:// or https:// URL, got {url!r}")
    return url.rstrip("/")


METRICS_LABELS = ("user", "key")


def _metrics_labels(key: str, value: Any) -> tuple[str, ...]:
    """A list, or (from the environment) names separated by commas."""
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list) or any(label not in METRICS_LABELS for label in value):
        raise ConfigError(f"{key}: expected a list of {', '.join(METRICS_LABELS)}, got {value!r}")
    return tuple(label for label in METRICS_LABELS if label in value)


def _optional_url(key: str, value: Any) -> str | None:
    return None if value == "" else _http_url(key, value)


def _headers(key: str, value: Any) -> Frozen:
    """A table of header names to values, or (from the environment) `name=value,name=value`."""
    if isinstance(value, str):
        pairs = [part.partition("=") for part in value.split(",") if part.strip()]
        if any(not sep for _, sep, _ in pairs):
            raise ConfigError(f"{key}: expected name=value pairs separated by commas")
        value = {name.strip(): text.strip() for name, _, text in pairs}
    if not isinstance(value, dict) or not all(
        isinstance(name, str) and name and isinstance(text, str) for name, text in value.items()
    ):
        raise ConfigError(f"{key}: expected a table of header names to string values")
    return Frozen(value)


KEYS: dict[str, Key] = {
    "host": Key(_str, "address to listen on"),
    "port": Key(_port, "port to listen on"),
    "workers": Key(_positive_int, "proxy processes sharing the port (SO_REUSEPORT)"),
    "db_url": Key(_db_url, "database URL (SQLite or PostgreSQL)"),
    "auto_upgrade": Key(_bool, "migrate the database to head when serve starts"),
    "stream_usage": Key(_choice("inject", "passthrough"), "ask upstreams for stream usage"),
    "cancel_on_disconnect": Key(_bool, "cancel the upstream request when the client leaves"),
    "connect_timeout": Key(_seconds, "seconds to connect to an upstream"),
    "read_timeout": Key(_seconds, "seconds an upstream may stay silent"),
    "client_header_timeout": Key(_seconds, "seconds a client has to send a request's headers"),
    "keepalive_timeout": Key(_seconds, "seconds an idle client connection is kept open"),
    "max_request_bytes": Key(_positive_int, "largest request body accepted (413 above)"),
    "client_body_timeout": Key(_seconds, "seconds a client may take to send its body (408)"),
    "max_record_bytes": Key(_positive_int, "largest non-stream response body recorded"),
    "max_stream_record_bytes": Key(_positive_int, "bytes of a stream its record is made from"),
    "store_raw_stream": Key(_bool, "keep the exact bytes of streams for playback"),
    "shutdown_grace": Key(_seconds, "seconds in-flight exchanges get on SIGTERM"),
    "queue_size": Key(_positive_int, "journaled records also held in memory for the writer"),
    "batch_size": Key(_positive_int, "records written per database transaction"),
    "batch_interval": Key(_seconds, "seconds the writer waits to fill a batch"),
    "spool_path": Key(_str, "the journal: every record lands here before the database"),
    "journal_max_bytes": Key(
        _positive_int, "largest the journal may grow (records not yet written)"
    ),
    "log_level": Key(_choice("debug", "info", "warning", "error"), "log verbosity"),
    "console_host": Key(_str, "address the console listens on"),
    "console_port": Key(_port, "port of the console serve runs (0: none)"),
    "console_token": Key(_optional_str, "token every console route needs (required off loopback)"),
    "metrics_labels": Key(_metrics_labels, "labels /metrics adds: user, key (can be unbounded)"),
    "otlp_endpoint": Key(_optional_url, "OTLP/HTTP traces URL; one span per exchange"),
    "otlp_headers": Key(_headers, "headers sent with every OTLP export"),
    "otlp_content": Key(_bool, "put message content in spans (never for omitted exchanges)"),
    "store_bodies": Key(
        _choice("full", "metadata"), "full: keep bodies; metadata: usage, cost, timings only"
    ),
    "retention_days": Key(_int, "prune exchanges older than N days, keeping cost (0: never)"),
    "retention_bodies_days": Key(_int, "drop bodies older than N days (0: with the exchange)"),
    "price_update": Key(_bool, "refresh genai-prices' price data in the background"),
    "price_update_url": Key(_http_url, "where price_update fetches genai-prices' data"),
}
FLAGS = {"db_url": "--db"}
"""Command-line flags not named after their key (the rest are `--<key>` with dashes): errors
about a value given by flag name the flag the user typed. A command whose flags differ (the
console's `--host` sets `console_host`) passes its own to `load`."""
UPSTREAM_KEYS = ("name", "base_url", "prefix", "api_key_env", "provider")
REDACT_KEYS = ("name", "preset", "pattern", "replace")
"""Fields of a `[[redact]]` table (`proxy.privacy.redact.parse_rules` checks them)."""
PRICE_KEYS = (*CONFIG_FIELDS, "note")
"""Fields of a `[prices."<model>"]` table (`proxy.pricing` checks them)."""
ENV_PREFIX = "FLIGHTREC_"


def flag(key: str, flags: Mapping[str, str] | None = None) -> str:
    """The command-line flag that sets config key `key` (`flags`: a command's own names)."""
    return (flags or {}).get(key) or FLAGS.get(key, "--" + key.replace("_", "-"))


def _parse_upstreams(raw: Any) -> tuple[Upstream, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError("upstreams: expected a non-empty array of tables ([[upstreams]])")
    upstreams: list[Upstream] = []
    for i, entry in enumerate(raw):
        where = f"upstreams[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a table")
        for key in entry:
            if key not in UPSTREAM_KEYS:
                raise ConfigError(f"{where}.{key}: unknown key (known: {', '.join(UPSTREAM_KEYS)})")
        name = _str(f"{where}.name", entry.get("name"))
        if not name.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"{where}.name: use letters, digits, - and _ only, got {name!r}")
        base_url = _http_url(f"{where}.base_url", entry.get("base_url"))
        prefix = _str(f"{where}.prefix", entry.get("prefix", "/v1" if i == 0 else f"/{name}/v1"))
        if not prefix.startswith("/"):
            raise ConfigError(f"{where}.prefix: must start with /, got {prefix!r}")
        api_key_env = _str(f"{where}.api_key_env", entry.get("api_key_env", "OPENAI_API_KEY"))
        provider = _optional_str(f"{where}.provider", entry.get("provider", ""))
        upstreams.append(Upstream(name, base_url, prefix.rstrip("/") or "/", api_key_env, provider))
    for key, label in (("name", "names"), ("prefix", "prefixes")):
        values = [getattr(u, key) for u in upstreams]
        if len(set(values)) != len(values):
            raise ConfigError(f"upstreams: {label} must be unique, got {values}")
    return tuple(upstreams)


def _parse_prices(raw: Any) -> Mapping[str, Mapping[str, Any]]:
    if not isinstance(raw, dict):
        raise ConfigError('prices: expected tables of prices ([prices."<model>"])')
    return Frozen({model: Frozen(fields) for model, fields in raw.items()})


def _check_across(config: Config) -> None:
    """What no one key can check: retention's two keys, prices and upstreams' providers."""
    days, bodies = config.retention_days, config.retention_bodies_days
    if days and bodies > days:
        raise ConfigError(
            f"retention_bodies_days: must not exceed retention_days ({days}), got {bodies}"
        )
    try:
        Prices(config.prices, upstream_providers(config.upstreams))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def load(
    path: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    flags: Mapping[str, str] | None = None,
) -> Config:
    """Build the config from a TOML file, the environment and flags, in that order.

    `path` falls back to `FLIGHTREC_CONFIG`. `overrides` are flag values (None = not given);
    the key `upstream` replaces the first upstream's base_url, as `FLIGHTREC_UPSTREAM` does.
    `flags` names the flag of a key where the command's differs from `flag(key)`. Only the
    value that wins is read, so a flag can stand in for a bad variable left in the environment.
    """
    env = os.environ if env is None else env
    path = path or env.get(ENV_PREFIX + "CONFIG") or None
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config: file not found: {path}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config: cannot read {path}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config: {path} is not valid TOML: {exc}") from None

    given: dict[str, tuple[str, Any]] = {}  # key: (where it was given, the value that wins)
    for key, value in raw.items():
        if key in ("upstreams", "prices", "redact"):
            continue
        if key not in KEYS:
            raise ConfigError(f"{key}: unknown config key (see config.example.toml)")
        given[key] = (key, value)
    for key in KEYS:
        env_value = env.get(ENV_PREFIX + key.upper())
        if env_value is not None:
            given[key] = (ENV_PREFIX + key.upper(), env_value)
    for key, value in (overrides or {}).items():
        if value is not None and key in KEYS:
            given[key] = (flag(key, flags), value)
    values = {key: KEYS[key].parse(where, value) for key, (where, value) in given.items()}

    config = replace(Config(), **values)
    if "upstreams" in raw:
        config = replace(config, upstreams=_parse_upstreams(raw["upstreams"]))
    if "prices" in raw:
        config = replace(config, prices=_parse_prices(raw["prices"]))
    rules = raw.get("redact")
    if (presets := env.get(ENV_PREFIX + "REDACT")) is not None:  # preset names, by commas
        rules = [{"preset": name.strip()} for name in presets.split(",") if name.strip()]
    if rules is not None:
        config = replace(config, redact=parse_rules(rules, ConfigError))
    _check_across(config)
    upstream_url, where = (overrides or {}).get("upstream"), "--upstream"
    if not upstream_url:
        upstream_url, where = env.get(ENV_PREFIX + "UPSTREAM"), ENV_PREFIX + "UPSTREAM"
    if upstream_url:
        first = replace(config.upstreams[0], base_url=_http_url(where, upstream_url))
        config = replace(config, upstreams=(first, *config.upstreams[1:]))
    return config
