"""`[[alerts]]` and `[[budgets]]` in the config: checked at load, every error naming its key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy.alert_rules import AlertRule, Budget, Scope, Where
from proxy.config import ConfigError, load

EXAMPLE = Path(__file__).resolve().parents[2] / "config.example.toml"


def _load(tmp_path: Path, text: str) -> tuple[tuple[AlertRule, ...], tuple[Budget, ...]]:
    path = tmp_path / "c.toml"
    path.write_text(text)
    config = load(path, env={})
    return config.alerts, config.budgets


def test_the_example_tables_load(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    block = text[text.index("# [[alerts]]") : text.index("# Names for API keys")]
    lines = re.findall(r"^# ((?:[a-z_]+ = .*)|(?:\[\[\w+\]\]))$", block, flags=re.MULTILINE)
    alerts, budgets = _load(tmp_path, "\n".join(lines))
    assert [(a.name, a.kind) for a in alerts] == [
        ("spend-per-team", "spend"),
        ("errors", "error_rate"),
        ("gpt-confidence", "confidence"),
    ]
    spend = alerts[0]
    assert (spend.window, spend.by, spend.threshold, spend.clear) == (
        3600.0,
        "tag:team",
        25.0,
        20.0,
    )
    assert spend.where == Where("gpt-5.5", "sk-...a1b2", "alice", "openai", (("env", "prod"),))
    assert spend.notify == ("log", "webhook")
    assert alerts[1].min_count == 20
    assert alerts[1].clear == pytest.approx(0.04)
    assert (alerts[2].baseline, alerts[2].metric) == (86400.0, "logprob")
    assert budgets == (
        Budget("team-a-monthly", Scope("tag", "a", "team"), "month", 500.0, "alert",
               ("log", "webhook"), "https://hooks.example/T000"),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[alerts]]\nkind = "spend"', "alerts[0].name: every alert needs a name"),
        ('[[alerts]]\nname = "a"\nkind = "cost"', "alerts[0].kind: expected one of spend,"),
        ('[[alerts]]\nname = "a"\nkind = "spend"\nthreshold = 1', "alerts[0].window: a spend"),
        ('[[alerts]]\nname = "a"\nkind = "spend"\nwindow = "1 hour"\nthreshold = 1',
         "alerts[0].window: expected a duration"),
        ('[[alerts]]\nname = "a"\nkind = "spend"\nwindow = "1h"', "alerts[0].threshold: a spend"),
        ('[[alerts]]\nname = "a"\nkind = "error_rate"\nwindow = "1h"\nthreshold = 5',
         "alerts[0].threshold: an error rate is a fraction"),
        ('[[alerts]]\nname = "a"\nkind = "spend"\nwindow = "1h"\nthreshold = 1\nclear = 2',
         "alerts[0].clear: must not be above threshold"),
        ('[[alerts]]\nname = "a"\nkind = "spend"\nwindow = "1h"\nthreshold = 1\nby = "team"',
         "alerts[0].by: expected one of model, key, user, day, upstream or tag:<key>"),
        ('[[alerts]]\nname = "a"\nkind = "fingerprint_change"\nthreshold = 1',
         "alerts[0].threshold: not used by a fingerprint_change alert"),
        ('[[alerts]]\nname = "a"\nkind = "unpriced"\nnotify = ["webhook"]',
         "alerts[0].webhook_url: notify has webhook"),
        ('[[alerts]]\nname = "a"\nkind = "unpriced"\ncolour = 1', "alerts[0].colour: unknown key"),
        ('[[alerts]]\nname = "a"\nkind = "unpriced"\n[[alerts]]\nname = "a"\nkind = "unpriced"',
         "alerts[1].name: 'a' names another one already"),
        ('[[budgets]]\nname = "b"\nscope = "team:a"\nperiod = "day"\nlimit_usd = 1',
         "budgets[0].scope: expected key:"),
        ('[[budgets]]\nname = "b"\nscope = "tag:team"\nperiod = "day"\nlimit_usd = 1',
         "budgets[0].scope: expected tag:<k>=<v>"),
        ('[[budgets]]\nname = "b"\nscope = "user:x"\nperiod = "year"\nlimit_usd = 1',
         "budgets[0].period: expected one of day, week, month"),
        ('[[budgets]]\nname = "b"\nscope = "user:x"\nperiod = "day"', "budgets[0].limit_usd"),
        ('[[budgets]]\nname = "b"\nscope = "user:x"\nperiod = "day"\nlimit_usd = 1\n'
         'action = "deny"', "budgets[0].action: expected one of alert, block"),
        ('[[alerts]]\nname = "b"\nkind = "unpriced"\n[[budgets]]\nname = "b"\nscope = "user:x"\n'
         'period = "day"\nlimit_usd = 1', "budgets[0].name: 'b' names an alert already"),
        ("alerts_interval = 0", "alerts_interval: expected a positive number of seconds"),
    ],
)  # fmt: skip
def test_errors_name_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    assert message in str(info.value)
