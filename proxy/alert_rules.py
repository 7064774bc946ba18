"""The `[[alerts]]` and `[[budgets]]` tables of the config, checked into rules (SPEC 13).

`proxy.config.load` calls `parse_watch`; every problem raises the config's error with the key
it is about (`alerts[0].window: ...`). Nothing here reads the database: the rules say what
`proxy.alerts.measure` reads and when a value crosses; `proxy.alerts` does the rest.

A rule fires when its value goes above `threshold` and clears when it comes back to `clear`
or below (hysteresis: between the two, it stays as it was), so a value hovering at the
threshold fires once, not at every evaluation.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Error = Callable[[str], Exception]

KINDS = ("spend", "error_rate", "fingerprint_change", "confidence", "unpriced")
NOTIFY = ("log", "webhook", "console")
PERIODS = ("day", "week", "month")
ACTIONS = ("alert", "block")
METRICS = ("logprob", "perplexity")
SCOPES = ("key", "user", "tag", "model")
LEVELS = (50, 80, 100)
"""Percentages of a budget's `limit_usd` that alert."""
BY = ("model", "key", "user", "day", "upstream")
"""The groupings of `flightrec cost --by`, besides `tag:<key>`."""
CLEAR_SHARE = 0.8
"""Where `clear` is not given: the share of the threshold a value must come back to."""
ALERT_KEYS = (
    "name", "kind", "window", "by", "model", "key", "user", "tag", "upstream", "threshold",
    "clear", "min_count", "metric", "baseline", "notify", "webhook_url",
)  # fmt: skip
BUDGET_KEYS = ("name", "scope", "period", "limit_usd", "action", "notify", "webhook_url")
_UNUSED = {
    "spend": {"min_count", "metric", "baseline"},
    "error_rate": {"metric", "baseline"},
    "fingerprint_change": {"by", "key", "user", "tag", "threshold", "clear", "min_count"}
    | {"metric", "baseline"},
    "confidence": set(),
    "unpriced": {"min_count", "metric", "baseline"},
}
"""Keys a kind has no use for: given, they are an error rather than silently ignored."""
_DURATION = re.compile(r"(\d+)\s*([smhdw])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


@dataclass(frozen=True, slots=True)
class Where:
    """The filters of `flightrec cost`: every one given must match."""

    model: str | None = None
    key: str | None = None
    """A key's hint (`sk-...a1b2`) or a prefix of its hash."""
    user: str | None = None
    upstream: str | None = None
    tags: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class AlertRule:
    name: str
    kind: str
    window: float
    """Seconds the value is taken over, ending now."""
    threshold: float
    clear: float
    """The value at or below which a firing alert clears."""
    by: str | None = None
    """A `cost --by` grouping: one alert per group; None: one for all."""
    where: Where = Where()
    min_count: int = 1
    """error_rate, confidence: fewer exchanges in the window are not judged."""
    metric: str = "logprob"
    """confidence: the drop of the mean token logprob, or the rise of the perplexity."""
    baseline: float = 86400.0
    """confidence: seconds of the trailing baseline, just before the window."""
    notify: tuple[str, ...] = ("log",)
    webhook_url: str | None = None


@dataclass(frozen=True, slots=True)
class Scope:
    """What a budget counts: `kind` is key, user, tag or model; `tag` the tag's key."""

    kind: str
    value: str
    tag: str | None = None

    def __str__(self) -> str:
        return f"tag:{self.tag}={self.value}" if self.tag else f"{self.kind}:{self.value}"


@dataclass(frozen=True, slots=True)
class Budget:
    name: str
    scope: Scope
    period: str
    limit_usd: float
    action: str = "alert"
    notify: tuple[str, ...] = ("log",)
    webhook_url: str | None = None


@dataclass(slots=True)
class Blocked:
    """What the relay reads on each request (`proxy.relay.budgets`); the background
    evaluation (`proxy.alerts.watch`) replaces `budgets` after each round."""

    budgets: tuple[Budget, ...] = ()
    """Budgets with `action = "block"` whose period's spend has reached `limit_usd`."""


def seconds(text: Any, where: str, error: Error) -> float:
    """A duration such as `30s`, `15m`, `1h`, `7d`, `1h30m`."""
    if not isinstance(text, str) or not text.strip():
        raise error(f"{where}: expected a duration such as 30s, 15m, 1h or 7d, got {text!r}")
    compact = text.replace(" ", "").lower()
    parts = _DURATION.findall(compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        raise error(f"{where}: expected a duration such as 30s, 15m, 1h or 7d, got {text!r}")
    total = sum(int(n) * _UNIT[u] for n, u in parts)
    if total <= 0:
        raise error(f"{where}: expected a duration above zero, got {text!r}")
    return float(total)


def _text(entry: dict[str, Any], key: str, where: str, error: Error) -> str | None:
    value = entry.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise error(f"{where}.{key}: expected a non-empty string, got {value!r}")
    return value


def _number(entry: dict[str, Any], key: str, where: str, error: Error) -> float | None:
    value = entry.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise error(f"{where}.{key}: expected a number >= 0, got {value!r}")
    return float(value)


def _table(raw: Any, at: int, section: str, known: tuple[str, ...], error: Error) -> str:
    where = f"{section}[{at}]"
    if not isinstance(raw, dict):
        raise error(f"{where}: expected a table")
    for key in raw:
        if key not in known:
            raise error(f"{where}.{key}: unknown key (known: {', '.join(known)})")
    return where


def _choice(value: Any, choices: tuple[str, ...], where: str, error: Error) -> str:
    if value not in choices:
        raise error(f"{where}: expected one of {', '.join(choices)}, got {value!r}")
    return str(value)


def _notify(entry: dict[str, Any], where: str, error: Error) -> tuple[tuple[str, ...], str | None]:
    url = _text(entry, "webhook_url", where, error)
    if url is not None and not url.startswith(("http://", "https://")):
        raise error(f"{where}.webhook_url: expected an http:// or https:// URL, got {url!r}")
    notify = entry.get("notify", ["log", "webhook"] if url else ["log"])
    if not isinstance(notify, list) or any(n not in NOTIFY for n in notify):
        raise error(f"{where}.notify: expected a list of {', '.join(NOTIFY)}, got {notify!r}")
    if "webhook" in notify and url is None:
        raise error(f"{where}.webhook_url: notify has webhook, so a webhook_url is needed")
    return tuple(n for n in NOTIFY if n in notify), url


def _by(value: Any, where: str, error: Error) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and value.lower().startswith("tag:") and value[4:].strip():
        return "tag:" + value[4:].strip().lower()
    if value not in BY:
        raise error(f"{where}.by: expected one of {', '.join(BY)} or tag:<key>, got {value!r}")
    return str(value)


def _tags(value: Any, where: str, error: Error) -> tuple[tuple[str, str], ...]:
    """`tag = "team=a"` or a list of them, as `cost --tag`."""
    values = [] if value is None else value if isinstance(value, list) else [value]
    found = []
    for text in values:
        key, sep, tag_value = text.partition("=") if isinstance(text, str) else ("", "", "")
        if not sep or not key.strip():
            raise error(f"{where}.tag: expected k=v (or a list of them), got {text!r}")
        found.append((key.strip().lower(), tag_value.strip()))
    return tuple(found)


def _where(entry: dict[str, Any], where: str, error: Error) -> Where:
    model, key = _text(entry, "model", where, error), _text(entry, "key", where, error)
    user, upstream = _text(entry, "user", where, error), _text(entry, "upstream", where, error)
    return Where(model, key, user, upstream, _tags(entry.get("tag"), where, error))


def _levels(kind: str, entry: dict[str, Any], where: str, error: Error) -> tuple[float, float]:
    """(threshold, clear) of a rule, with each kind's defaults."""
    threshold = _number(entry, "threshold", where, error)
    if threshold is None and kind in ("spend", "error_rate", "confidence"):
        raise error(f"{where}.threshold: a {kind} alert needs a threshold")
    if kind == "error_rate" and threshold is not None and not 0 < threshold < 1:
        raise error(f"{where}.threshold: an error rate is a fraction between 0 and 1")
    threshold = threshold or 0.0
    counts = kind in ("unpriced", "fingerprint_change")  # the first crosses, none left clears
    default = threshold if counts else threshold * CLEAR_SHARE
    clear = _number(entry, "clear", where, error)
    clear = default if clear is None else clear
    if clear > threshold:
        raise error(f"{where}.clear: must not be above threshold ({threshold}), got {clear}")
    return threshold, clear


def _alert(entry: dict[str, Any], where: str, error: Error) -> AlertRule:
    name = _text(entry, "name", where, error)
    if name is None:
        raise error(f"{where}.name: every alert needs a name")
    kind = _choice(entry.get("kind"), KINDS, f"{where}.kind", error)
    for key in sorted(_UNUSED[kind] & entry.keys()):
        raise error(f"{where}.{key}: not used by a {kind} alert")
    if "window" not in entry and kind in ("spend", "error_rate", "confidence"):
        raise error(f"{where}.window: a {kind} alert needs a window, such as 1h")
    window = seconds(entry.get("window", "1h"), f"{where}.window", error)
    threshold, clear = _levels(kind, entry, where, error)
    by = _by(entry.get("by", "model" if kind == "unpriced" else None), where, error)
    if kind == "confidence" and by not in (None, "model"):
        raise error(f"{where}.by: a confidence alert is always by model")
    min_count = entry.get("min_count", 1)
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise error(f"{where}.min_count: expected an integer >= 1, got {min_count!r}")
    metric = _choice(entry.get("metric", "logprob"), METRICS, f"{where}.metric", error)
    baseline = seconds(entry.get("baseline", "24h"), f"{where}.baseline", error)
    notify, url = _notify(entry, where, error)
    return AlertRule(
        name, kind, window, threshold, clear, "model" if kind == "confidence" else by,
        _where(entry, where, error), min_count, metric, baseline, notify, url,
    )  # fmt: skip


def _scope(value: Any, where: str, error: Error) -> Scope:
    text = value if isinstance(value, str) else ""
    kind, _, rest = text.partition(":")
    if kind not in SCOPES or not rest:
        raise error(
            f"{where}.scope: expected key:<hash prefix or hint>, user:<id>, tag:<k>=<v> or "
            f"model:<name>, got {value!r}"
        )
    if kind != "tag":
        return Scope(kind, rest)
    key, sep, tag_value = rest.partition("=")
    if not sep or not key.strip():
        raise error(f"{where}.scope: expected tag:<k>=<v>, got {value!r}")
    return Scope("tag", tag_value.strip(), key.strip().lower())


def _budget(entry: dict[str, Any], where: str, error: Error) -> Budget:
    name = _text(entry, "name", where, error)
    if name is None:
        raise error(f"{where}.name: every budget needs a name")
    scope = _scope(entry.get("scope"), where, error)
    period = _choice(entry.get("period"), PERIODS, f"{where}.period", error)
    limit = _number(entry, "limit_usd", where, error)
    if not limit:
        raise error(f"{where}.limit_usd: expected a spend limit in USD above 0")
    action = _choice(entry.get("action", "alert"), ACTIONS, f"{where}.action", error)
    notify, url = _notify(entry, where, error)
    return Budget(name, scope, period, limit, action, notify, url)


def parse_alerts(raw: Any, error: Error) -> tuple[AlertRule, ...]:
    """The `[[alerts]]` tables."""
    if not isinstance(raw, list):
        raise error("alerts: expected an array of tables ([[alerts]])")
    rules = [_alert(entry, _table(entry, at, "alerts", ALERT_KEYS, error), error)
             for at, entry in enumerate(raw)]  # fmt: skip
    _unique([rule.name for rule in rules], "alerts", error)
    return tuple(rules)


def parse_budgets(raw: Any, error: Error) -> tuple[Budget, ...]:
    """The `[[budgets]]` tables."""
    if not isinstance(raw, list):
        raise error("budgets: expected an array of tables ([[budgets]])")
    budgets = [_budget(entry, _table(entry, at, "budgets", BUDGET_KEYS, error), error)
               for at, entry in enumerate(raw)]  # fmt: skip
    _unique([budget.name for budget in budgets], "budgets", error)
    return tuple(budgets)


def _unique(names: list[str], section: str, error: Error) -> None:
    for at, name in enumerate(names):
        if name in names[:at]:
            raise error(f"{section}[{at}].name: {name!r} names another one already")


def parse_watch(raw: dict[str, Any], error: Error) -> dict[str, Any]:
    """The config's `alerts` and `budgets` from its `[[alerts]]` and `[[budgets]]` tables
    (none when absent); names are unique across both (one state table, one /alerts page)."""
    rules = parse_alerts(raw.get("alerts", []), error)
    limits = parse_budgets(raw.get("budgets", []), error)
    alert_names = {rule.name for rule in rules}
    for at, budget in enumerate(limits):
        if budget.name in alert_names:
            raise error(f"budgets[{at}].name: {budget.name!r} names an alert already")
    return {"alerts": rules, "budgets": limits}
