"""`flightrec alerts`: the configured alerts and budgets with their state in the database;
`flightrec alerts rules`: the same rules as Prometheus alerting rules (docs/alerts.md)."""

from __future__ import annotations

import asyncio
from typing import Any

import click

from proxy.alert_rules import AlertRule, Budget
from proxy.alerts import state
from proxy.alerts.measure import span
from proxy.alerts.prom import rules_yaml
from proxy.cli.options import config_option, db_option, load_config, print_json, user_errors
from proxy.store.read import reading
from proxy.text import printable


def _describe(rule: AlertRule | Budget) -> str:
    if isinstance(rule, Budget):
        return f"budget {rule.scope} ${rule.limit_usd:g}/{rule.period} {rule.action}"
    over = f" over {span(rule.window)}"
    by = f" by {rule.by}" if rule.by else ""
    return f"{rule.kind}{over}{by} > {rule.threshold:g}"


def _lines(rules: list[AlertRule | Budget], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One line per rule and group that has a state; `ok` for a rule that never moved."""
    found = []
    for rule in rules:
        mine = [row for row in rows if row["alert"] == rule.name]
        for row in mine or [{"group": "", "state": "ok", "changed_at": None, "detail": None}]:
            found.append(
                {
                    "name": rule.name,
                    "rule": _describe(rule),
                    "group": row["group"],
                    "state": row["state"],
                    "since": row["changed_at"],
                    "detail": row["detail"],
                }
            )
    return found


@click.group(invoke_without_command=True)
@config_option
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@click.pass_context
@user_errors
def alerts(ctx: click.Context, config_path: str | None, db_url: str | None, as_json: bool) -> None:
    """The configured alerts and budgets, with their state."""
    if ctx.invoked_subcommand is not None:
        return
    cfg = load_config(config_path, db_url=db_url)
    rules: list[AlertRule | Budget] = [*cfg.alerts, *cfg.budgets]
    if not rules:
        raise click.ClickException("no [[alerts]] or [[budgets]] in the config (docs/alerts.md)")

    async def fetch() -> list[dict[str, Any]]:
        async with reading(cfg.db_url) as engine:
            return await state.states(engine)

    lines = _lines(rules, asyncio.run(fetch()))
    if as_json:
        print_json(lines)
        return
    for line in lines:
        group = f" [{line['group']}]" if line["group"] else ""
        since = f" since {line['since']}" if line["since"] else ""
        detail = f": {line['detail']}" if line["detail"] else ""
        text = f"{line['state']:<8} {line['name']}{group} ({line['rule']}){since}{detail}"
        click.echo(printable(text))


@alerts.command("rules")
@config_option
@user_errors
def alerts_rules(config_path: str | None) -> None:
    """Print the alerts and budgets as Prometheus alerting rules (YAML)."""
    cfg = load_config(config_path)
    click.echo(rules_yaml(cfg.alerts, cfg.budgets, cfg.metrics_labels), nl=False)
