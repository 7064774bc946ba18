"""Configuration: TOML file, then `FLIGHTREC_*` environment, then command-line flags.

Every key is declared once in `KEYS`; `config.example.toml` documents each of them (a test
checks it). Validation happens at start and every error names the key it is about.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from proxy import config_values as v
from proxy.alert_rules import AlertRule, Budget, parse_watch
from proxy.config_values import ConfigError as ConfigError  # the error every command catches
from proxy.config_values import Frozen as Frozen
from proxy.config_values import Key
from proxy.keynames import table
from proxy.pricing import CONFIG_FIELDS, UPDATE_URL, Prices, upstream_providers
from proxy.privacy.redact import RedactRule, parse_rules

DEFAULT_DB_URL = "sqlite+aiosqlite:///flightrec.db"
DEFAULT_UPSTREAM = "https://api.openai.com/v1"


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
    max_connections: int = 8192
    max_streams: int = 4096
    max_request_bytes: int = 64 * 1024 * 1024
    client_body_timeout: float = 60.0
    max_record_bytes: int = 16 * 1024 * 1024
    max_stream_record_bytes: int = 16 * 1024 * 1024
    store_raw_stream: bool = True
    store_audio: bool = False
    max_session_record_bytes: int = 64 * 1024 * 1024
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
    otlp_content_max_bytes: int = 16 * 1024
    """Each content attribute of a span is cut to this many bytes, with a marker saying so."""
    store_bodies: str = "full"
    redact: tuple[RedactRule, ...] = ()
    """`[[redact]]` rules, in order (`proxy.privacy.redact`)."""
    pseudonym_key: str | None = field(default=None, repr=False)  # privacy/pseudonym.py; secret
    retention_days: int = 0
    """Prune exchanges older than this many days (usage and cost kept in rollups); 0: never."""
    retention_bodies_days: int = 0
    """Drop bodies (choices, logprobs, raw streams) older than N days; 0: with their exchange."""
    prices: Mapping[str, Mapping[str, Any]] = field(default_factory=Frozen)
    """`[prices."<model>"]` as written (USD per 1M tokens), read-only; win over genai-prices."""
    price_update: bool = False
    """Refresh genai-prices' data in the background (no outbound call for prices when off)."""
    price_update_url: str = UPDATE_URL
    alerts: tuple[AlertRule, ...] = ()
    budgets: tuple[Budget, ...] = ()
    alerts_interval: float = 30.0
    keys: Mapping[str, str] = field(default_factory=Frozen)  # `[keys]` (`proxy.keynames`)


KEYS: dict[str, Key] = {
    "host": Key(v.text, "address to listen on"),
    "port": Key(v.port, "port to listen on"),
    "workers": Key(v.positive_int, "proxy processes sharing the port (SO_REUSEPORT)"),
    "db_url": Key(v.db_url, "database URL (SQLite or PostgreSQL)"),
    "auto_upgrade": Key(v.boolean, "migrate the database to head when serve starts"),
    "stream_usage": Key(v.choice("inject", "passthrough"), "ask upstreams for stream usage"),
    "cancel_on_disconnect": Key(v.boolean, "cancel the upstream request when the client leaves"),
    "connect_timeout": Key(v.seconds, "seconds to connect to an upstream"),
    "read_timeout": Key(v.seconds, "seconds an upstream may stay silent"),
    "client_header_timeout": Key(v.seconds, "seconds a client has to send a request's headers"),
    "keepalive_timeout": Key(v.seconds, "seconds an idle client connection is kept open"),
    "max_connections": Key(v.positive_int, "client connections per worker (503 past them)"),
    "max_streams": Key(v.positive_int, "streams relayed at once per worker (503 past them)"),
    "max_request_bytes": Key(v.positive_int, "largest request body accepted (413 above)"),
    "client_body_timeout": Key(v.seconds, "seconds a client may take to send its body (408)"),
    "max_record_bytes": Key(v.positive_int, "largest non-stream response body recorded"),
    "max_stream_record_bytes": Key(v.positive_int, "bytes of a stream its record is made from"),
    "store_raw_stream": Key(v.boolean, "keep the exact bytes of streams for playback"),
    "store_audio": Key(v.boolean, "keep WebSocket sessions' audio in the record (always counted)"),
    "max_session_record_bytes": Key(v.positive_int, "bytes one WebSocket session's record keeps"),
    "shutdown_grace": Key(v.seconds, "seconds in-flight exchanges get on SIGTERM"),
    "queue_size": Key(v.positive_int, "journaled records also held in memory for the writer"),
    "batch_size": Key(v.positive_int, "records written per database transaction"),
    "batch_interval": Key(v.seconds, "seconds the writer waits to fill a batch"),
    "spool_path": Key(v.text, "the journal: every record lands here before the database"),
    "journal_max_bytes": Key(v.positive_int, "largest the journal may grow (unwritten records)"),
    "log_level": Key(v.choice("debug", "info", "warning", "error"), "log verbosity"),
    "console_host": Key(v.text, "address the console listens on"),
    "console_port": Key(v.port, "port of the console serve runs (0: none)"),
    "console_token": Key(
        v.optional(v.text), "token every console route needs (off loopback: required)"
    ),
    "metrics_labels": Key(v.metrics_labels, "labels /metrics adds: user, key (can be unbounded)"),
    "otlp_endpoint": Key(v.optional(v.http_url), "OTLP/HTTP traces URL; one span per exchange"),
    "otlp_headers": Key(v.headers, "headers sent with every OTLP export"),
    "otlp_content": Key(v.boolean, "put message content in spans (never for omitted exchanges)"),
    "otlp_content_max_bytes": Key(v.positive_int, "most bytes of content in one span attribute"),
    "pseudonym_key": Key(v.optional(v.text), "key of identifiers' pseudonyms (default: generated)"),
    "store_bodies": Key(v.choice("full", "metadata"), "full: bodies; metadata: usage, cost, times"),
    "retention_days": Key(v.integer, "prune exchanges older than N days, keeping cost (0: never)"),
    "retention_bodies_days": Key(v.integer, "drop bodies older than N days (0: with the exchange)"),
    "price_update": Key(v.boolean, "refresh genai-prices' price data in the background"),
    "price_update_url": Key(v.http_url, "where price_update fetches genai-prices' data"),
    "alerts_interval": Key(v.seconds, "seconds between two evaluations of alerts and budgets"),
}
FLAGS = {"db_url": "--db"}
"""Flags not named after their key (the rest are `--<key>`): an error names the flag typed. A
command whose flags differ (the console's `--host` sets `console_host`) passes its own."""
UPSTREAM_KEYS = ("name", "base_url", "prefix", "api_key_env", "provider")
REDACT_KEYS = ("name", "preset", "pattern", "replace")
"""Fields of a `[[redact]]` table (`proxy.privacy.redact.parse_rules` checks them)."""
PRICE_KEYS = (*CONFIG_FIELDS, "note")
"""Fields of a `[prices."<model>"]` table (`proxy.pricing` checks them)."""
ENV_PREFIX = "FLIGHTREC_"
TABLES = ("upstreams", "prices", "redact", "alerts", "budgets", "keys")  # tables: not `KEYS`


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
        name = v.text(f"{where}.name", entry.get("name"))
        if not name.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"{where}.name: use letters, digits, - and _ only, got {name!r}")
        base_url = v.http_url(f"{where}.base_url", entry.get("base_url"))
        prefix = v.text(f"{where}.prefix", entry.get("prefix", "/v1" if i == 0 else f"/{name}/v1"))
        if not prefix.startswith("/"):
            raise ConfigError(f"{where}.prefix: must start with /, got {prefix!r}")
        api_key_env = v.text(f"{where}.api_key_env", entry.get("api_key_env", "OPENAI_API_KEY"))
        provider = v.optional(v.text)(f"{where}.provider", entry.get("provider", ""))
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


def _check_retention(config: Config) -> None:
    """What no one key can check: retention's two keys, prices and upstreams' providers
    (checked by building the prices they make)."""
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
    uses: Collection[str] | None = None,
) -> Config:
    """Build the config from a TOML file (`path`, else `FLIGHTREC_CONFIG`), the environment
    and flags (`overrides`, None = not given; `upstream` replaces the first upstream's
    base_url, as `FLIGHTREC_UPSTREAM` does), in that order. `flags` names a key's flag where
    the command's differs from `flag(key)`. Only the value that wins is read (a flag can stand
    in for a bad variable), and only of the keys and `TABLES` in `uses` (None: all), the rest
    keeping their defaults: `FLIGHTREC_PORT=abc flightrec logs` works. Unknown keys fail."""
    env = os.environ if env is None else env
    raw = _read_file(path or env.get(ENV_PREFIX + "CONFIG") or None)
    used = set(KEYS).union(TABLES) if uses is None else set(uses)
    given: dict[str, tuple[str, Any]] = {}  # key: (where it was given, the value that wins)
    for key, value in raw.items():
        if key in TABLES:
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
    values = {k: KEYS[k].parse(where, v) for k, (where, v) in given.items() if k in used}

    watch = parse_watch(raw, ConfigError) if used & {"alerts", "budgets"} else {}
    config = replace(Config(), **values, **watch, **table(raw, ConfigError, used))
    if "upstreams" in raw and "upstreams" in used:
        config = replace(config, upstreams=_parse_upstreams(raw["upstreams"]))
    if "prices" in raw and "prices" in used:
        config = replace(config, prices=_parse_prices(raw["prices"]))
    rules = raw.get("redact")
    if (presets := env.get(ENV_PREFIX + "REDACT")) is not None:  # preset names, by commas
        rules = [{"preset": name.strip()} for name in presets.split(",") if name.strip()]
    if rules is not None and "redact" in used:
        config = replace(config, redact=parse_rules(rules, ConfigError))
    _check_retention(config)
    upstream_url, where = (overrides or {}).get("upstream"), "--upstream"
    if not upstream_url:
        upstream_url, where = env.get(ENV_PREFIX + "UPSTREAM"), ENV_PREFIX + "UPSTREAM"
    if upstream_url and "upstreams" in used:
        first = replace(config.upstreams[0], base_url=v.http_url(where, upstream_url))
        config = replace(config, upstreams=(first, *config.upstreams[1:]))
    return config


def _read_file(path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The TOML config file's tables; {} without one."""
    try:
        return {} if path is None else tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config: file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config: cannot read {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config: {path} is not valid TOML: {exc}") from None
