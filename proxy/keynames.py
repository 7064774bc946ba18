"""Names for API keys (`[keys]` in the config): `"sk-...a1b2" = "ci-bot"`, or a prefix of the
key's hash (`"3f9a0c" = "batch-jobs"`). The record keeps only the hash and hint; a name is
applied when shown (console, `cost --by key`) and accepted wherever a key filter is
(`--key ci-bot`, `key=ci-bot`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

HEX = frozenset("0123456789abcdef")


def checked(raw: object, error: type[Exception]) -> dict[str, str]:
    """The `[keys]` table, checked: `error` naming the entry at fault."""
    if not isinstance(raw, dict):
        raise error('keys: expected a table of names, e.g. [keys] "sk-...a1b2" = "ci-bot"')
    out = {}
    for key, name in raw.items():
        if not isinstance(name, str) or not name.strip():
            raise error(f"keys.{key}: expected a name (text), got {name!r}")
        is_hint = "..." in key
        if not is_hint and not (len(key) >= 4 and set(key.lower()) <= HEX):
            raise error(
                f"keys.{key}: expected a key hint (sk-...a1b2) or a prefix of the key's hash "
                "(at least 4 hex digits)"
            )
        out[key if is_hint else key.lower()] = name.strip()
    return out


def table(raw: Mapping[str, Any], error: type[Exception], used: Any) -> dict[str, Any]:
    """`{"keys": ...}`: a config file's `[keys]` table, checked, as `Config` takes it; {}
    when the command does not use it (`"keys" not in used`)."""
    return {"keys": checked(raw.get("keys", {}), error)} if "keys" in used else {}


class KeyNames:
    """The configured names, looked up by an exchange's hash and hint."""

    def __init__(self, table: Mapping[str, str] | None = None) -> None:
        self.table = dict(table or {})
        self._by_name = {name: key for key, name in self.table.items()}

    def name(self, key_hash: str | None, key_hint: str | None) -> str | None:
        if not self.table:
            return None
        if key_hint is not None and key_hint in self.table:
            return self.table[key_hint]
        if key_hash:
            for key, name in self.table.items():
                if "..." not in key and key_hash.startswith(key):
                    return name
        return None

    def resolve(self, text: str) -> str:
        """A key filter's value: a configured name stands for its hint or hash prefix."""
        return self._by_name.get(text, text)
