"""The console's `/alerts`: every configured alert and budget with its state, then the past
moves (fired, cleared, budget levels) with what crossed, newest first.

Read from the database (`alert_state`, `alert_events`), so the console shows what every
proxy sharing it decided, whether or not it runs inside `serve`.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from proxy.alert_rules import AlertRule, Budget
from proxy.alerts import state as alert_state
from proxy.alerts.measure import span
from proxy.console.pages import render
from proxy.console.state import state

PAST = 200
"""Moves the page lists."""


def _rule_text(rule: AlertRule | Budget) -> str:
    if isinstance(rule, Budget):
        return f"{rule.scope}: ${rule.limit_usd:g} a {rule.period}, {rule.action}"
    by = f", by {rule.by}" if rule.by else ""
    return f"{rule.kind} over {span(rule.window)}{by}: above {rule.threshold:g}"


def current(rules: list[AlertRule | Budget], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A row per state row, and one per configured rule that never moved; firing first."""
    described = {rule.name: _rule_text(rule) for rule in rules}
    found = [{**row, "rule": described.get(row["alert"], "(not in this config)")} for row in rows]
    moved = {row["alert"] for row in rows}
    for rule in rules:
        if rule.name not in moved:
            never = {"alert": rule.name, "group": "", "state": "ok", "value": None}
            found.append(
                {**never, "detail": None, "changed_at": None, "rule": described[rule.name]}
            )
    return sorted(found, key=lambda row: (row["state"] == "ok", row["alert"], row["group"]))


async def alerts_view(request: web.Request) -> web.Response:
    console = state(request)
    engine = console.db()
    rules: list[AlertRule | Budget] = [*console.config.alerts, *console.config.budgets]
    rows = current(rules, await alert_state.states(engine))
    past = await alert_state.events(engine, PAST)
    return render(request, "alerts.html", current=rows, past=past)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/alerts", alerts_view)
