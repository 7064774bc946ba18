"""`flightrec alerts rules`: Prometheus alerting rules that `promtool check rules` accepts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from proxy.cli.main import main

CONFIG = """
metrics_labels = ["user"]

[[alerts]]
name = "spend-model"
kind = "spend"
window = "1h"
by = "model"
model = "gpt-5.5"
user = "alice"
threshold = 25.0

[[alerts]]
name = "spend-per-team"
kind = "spend"
window = "1h"
by = "tag:team"
threshold = 25.0

[[alerts]]
name = "errors"
kind = "error_rate"
window = "15m"
threshold = 0.05
min_count = 20

[[alerts]]
name = "backend"
kind = "fingerprint_change"

[[alerts]]
name = "confidence"
kind = "confidence"
window = "1h"
threshold = 0.5

[[alerts]]
name = "unpriced"
kind = "unpriced"
window = "30m"

[[budgets]]
name = "team-a"
scope = "tag:team=a"
period = "month"
limit_usd = 500.0
action = "block"
"""

EXPRESSIONS = [
    'sum by (model) (increase(flightrec_cost_usd_total{model="gpt-5.5",user="alice"}[1h])) > 25',
    'max by (group) (flightrec_alert_firing{alert="spend-per-team"}) == 1',
    'sum (increase(flightrec_requests_total{outcome!="ok"}[15m])) / sum (increase('
    "flightrec_requests_total[15m]))) > 0.05 and sum (increase(flightrec_requests_total[15m]))"
    " >= 20",
    "sum by (upstream, model) (increase(flightrec_fingerprint_changes_total[1h])) > 0",
    'max by (group) (flightrec_alert_firing{alert="confidence"}) == 1',
    "sum by (model) (increase(flightrec_unpriced_requests_total[30m])) > 0",
    'max(flightrec_alert_value{alert="team-a"}) >= 250',
    'max(flightrec_alert_value{alert="team-a"}) >= 400',
    'max(flightrec_alert_value{alert="team-a"}) >= 500',
]


def _rules(tmp_path: Path) -> str:
    config = tmp_path / "flightrec.toml"
    config.write_text(CONFIG)
    result = CliRunner().invoke(main, ["alerts", "rules", "--config", str(config)])
    assert result.exit_code == 0, result.output
    return result.output


def test_each_kind_reads_its_counter(tmp_path: Path) -> None:
    text = _rules(tmp_path)
    found = [line.split("expr: ", 1)[1] for line in text.splitlines() if "expr: " in line]
    assert len(found) == len(EXPRESSIONS)
    for expr, expected in zip(found, EXPRESSIONS, strict=True):
        assert expected in expr.encode().decode("unicode_escape")
    assert "# spend-per-team: from the gauge flightrec keeps" in text


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian: apt-get install prometheus)")
    path = tmp_path / "rules.yml"
    path.write_text(_rules(tmp_path))
    checked = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 9 rules found" in checked.stdout
