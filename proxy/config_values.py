"""Values of the configuration: how each kind of value is read and checked, and the one error
type a bad value raises (its message names the key). `config.py` declares the keys with these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit


class ConfigError(Exception):
    """A configuration problem; the message names the key."""


class Frozen(Mapping[str, Any]):
    """A read-only mapping that pickles (`serve --workers` sends the config to its workers)."""

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
class Key:
    parse: Callable[[str, Any], Any]
    doc: str


def integer(key: str, value: Any, minimum: int = 0) -> int:
    if isinstance(value, str):
        try:
            value = int(value)
        except ValueError:
            raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def port(key: str, value: Any) -> int:
    port = integer(key, value)
    if port > 65535:
        raise ConfigError(f"{key}: expected a port number 0-65535, got {port}")
    return port


def positive_int(key: str, value: Any) -> int:
    return integer(key, value, minimum=1)


def seconds(key: str, value: Any) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"{key}: expected a number of seconds, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigError(f"{key}: expected a positive number of seconds, got {value!r}")
    return float(value)


def boolean(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
        return True
    if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def text(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: expected a non-empty string, got {value!r}")
    return value


def choice(*choices: str) -> Callable[[str, Any], str]:
    def parse(key: str, value: Any) -> str:
        if value not in choices:
            raise ConfigError(f"{key}: expected one of {', '.join(choices)}, got {value!r}")
        return str(value)

    return parse


def optional(parse: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    """`parse`, with "" for none."""
    return lambda key, value: None if value == "" else parse(key, value)


def db_url(key: str, value: Any) -> str:
    url = text(key, value)
    if not url.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
        raise ConfigError(
            f"{key}: expected a sqlite+aiosqlite:// or postgresql+asyncpg:// URL, got {url!r}"
        )
    return url


def http_url(key: str, value: Any) -> str:
    url = text(key, value)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{key}: expected an http:// or https:// URL, got {url!r}")
    return url.rstrip("/")


METRICS_LABELS = ("user", "key")


def metrics_labels(key: str, value: Any) -> tuple[str, ...]:
    """A list, or (from the environment) names separated by commas."""
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list) or any(label not in METRICS_LABELS for label in value):
        raise ConfigError(f"{key}: expected a list of {', '.join(METRICS_LABELS)}, got {value!r}")
    return tuple(label for label in METRICS_LABELS if label in value)


def headers(key: str, value: Any) -> Frozen:
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
