"""`flightrec alerts rules`: the rules as Prometheus alerting rules over the `flightrec_*`
metrics, for teams that alert from Prometheus (`promtool check rules` accepts the output).

Each kind maps to the counters of SPEC section 9 where they can say it: spend to
`increase(flightrec_cost_usd_total[window])`, error_rate to `flightrec_requests_total` by
outcome, fingerprint_change to `flightrec_fingerprint_changes_total`, unpriced to
`flightrec_unpriced_requests_total`. What the counters cannot say (a confidence baseline, a
calendar period, a tag) is read from the gauges flightrec itself keeps, `flightrec_alert_value`
and `flightrec_alert_firing`, and a comment in the output says so.

The output is YAML written by hand: every string is a JSON string, which YAML reads as is.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from proxy.alert_rules import AlertRule, Budget
from proxy.alerts.measure import span

LABELS = {"model": "model", "upstream": "upstream", "key": "key", "user": "user"}
"""`by` groupings that are metric labels (key and user: only with `metrics_labels`)."""


def _name(name: str) -> str:
    """A valid Prometheus alert name for a rule's name."""
    return "Flightrec_" + re.sub(r"[^A-Za-z0-9_]", "_", name)


def _matchers(rule: AlertRule, labels: Sequence[str]) -> tuple[str, str | None]:
    """The label matchers of a rule's filters, or why they cannot be said with labels."""
    where = rule.where
    found = []
    if where.tags:
        return "", "a tag filter (tags are not metric labels)"
    for label, value in (("model", where.model), ("upstream", where.upstream)):
        if value is not None:
            found.append(f"{label}={json.dumps(value)}")
    if where.user is not None:
        if "user" not in labels:
            return "", 'a user filter without metrics_labels = ["user"]'
        found.append(f"user={json.dumps(where.user)}")
    if where.key is not None:
        if "key" not in labels or "..." in where.key:
            return "", 'a key filter (needs metrics_labels = ["key"] and a hash prefix)'
        found.append(f"key=~{json.dumps(re.escape(where.key.lower()) + '.*')}")
    return ",".join(found), None


def _by(rule: AlertRule, labels: Sequence[str]) -> tuple[str, str | None]:
    if rule.by is None:
        return "", None
    label = LABELS.get(rule.by)
    if label is None or (label in ("key", "user") and label not in labels):
        return "", f"by = {rule.by!r} (not a metric label)"
    return label, None


def _expr(rule: AlertRule, labels: Sequence[str]) -> tuple[str, str | None]:
    """The PromQL of a rule, or the gauge's, with the reason it had to be the gauge."""
    matchers, why = _matchers(rule, labels)
    by, why_by = _by(rule, labels)
    why = why or why_by
    if rule.kind == "fingerprint_change":
        by = "upstream, model"
    if why is not None or rule.kind == "confidence":
        why = why or "a trailing baseline of token logprobs (no counter holds logprobs)"
        gauge = f"flightrec_alert_firing{{alert={json.dumps(rule.name)}}}"
        return f"max by (group) ({gauge}) == 1", why
    window = span(rule.window)

    def total(metric: str, more: str = "") -> str:
        inside = ",".join(part for part in (matchers, more) if part)
        summed = f"sum by ({by})" if by else "sum"
        selector = f"{metric}{{{inside}}}" if inside else metric
        return f"{summed} (increase({selector}[{window}]))"

    if rule.kind == "spend":
        return f"{total('flightrec_cost_usd_total')} > {rule.threshold:g}", None
    if rule.kind == "unpriced":
        return f"{total('flightrec_unpriced_requests_total')} > {rule.threshold:g}", None
    if rule.kind == "fingerprint_change":
        return f"{total('flightrec_fingerprint_changes_total')} > 0", None
    requests = total("flightrec_requests_total")
    failed = total("flightrec_requests_total", 'outcome!="ok"')
    return (
        f"({failed} / {requests}) > {rule.threshold:g} and {requests} >= {rule.min_count}",
        None,
    )


def _rule(alert: str, expr: str, labels: dict[str, str], summary: str) -> list[str]:
    lines = [f"      - alert: {alert}", f"        expr: {json.dumps(expr)}", "        labels:"]
    lines += [f"          {key}: {json.dumps(value)}" for key, value in labels.items()]
    lines += ["        annotations:", f"          summary: {json.dumps(summary)}"]
    return lines


def rules_yaml(
    rules: Sequence[AlertRule], budgets: Sequence[Budget], metrics_labels: Sequence[str] = ()
) -> str:
    """A Prometheus rule file with one group, `flightrec`, holding every rule and budget."""
    lines = ["# Prometheus alerting rules for flightrec (flightrec alerts rules).", "groups:"]
    lines += ["  - name: flightrec", "    rules:"]
    for rule in rules:
        expr, why = _expr(rule, metrics_labels)
        if why is not None:
            lines.append(
                f"      # {rule.name}: from the gauge flightrec keeps; the counters lack {why}"
            )
        labels = {"flightrec_alert": rule.name, "kind": rule.kind}
        summary = f"flightrec {rule.kind} alert {rule.name}: {{{{ $value }}}}"
        lines += _rule(_name(rule.name), expr, labels, summary)
    for budget in budgets:
        lines.append(
            f"      # {budget.name}: a calendar {budget.period}, from the gauge flightrec keeps"
        )
        value = f"max(flightrec_alert_value{{alert={json.dumps(budget.name)}}})"
        for level in (50, 80, 100):
            expr = f"{value} >= {budget.limit_usd * level / 100:g}"
            labels = {"flightrec_alert": budget.name, "kind": "budget", "level": str(level)}
            summary = (
                f"flightrec budget {budget.name} ({budget.scope}) at {level}%: ${{{{ $value }}}}"
            )
            lines += _rule(f"{_name(budget.name)}_{level}", expr, labels, summary)
    if not rules and not budgets:
        lines[-1] = "    rules: []"
    return "\n".join(lines) + "\n"
