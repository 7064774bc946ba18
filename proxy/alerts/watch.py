"""The background evaluation: every `alerts_interval` seconds, each rule and budget is measured
from the database, judged against its state, moved (`state.move`) and, by the one process
whose move took, delivered.

It runs as a task of `serve`'s application (`background`), in every process that serves, so
alerts go on while any of them runs; the database keeps it to one delivery per crossing. It
also keeps the relay's `Blocked` budgets and the `flightrec_alert_*` gauges of `/metrics`.
A failed evaluation (database down) logs one line per cause and tries again next time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.alert_rules import LEVELS, AlertRule, Blocked, Budget
from proxy.alerts import state
from proxy.alerts.deliver import Delivery
from proxy.alerts.measure import Baselines, Reading, measure, money, span, spent
from proxy.alerts.state import FIRING, OK, Move
from proxy.config import Config
from proxy.store.engine import create_engine, describe

log = logging.getLogger("proxy.alerts")

STOP_WAIT = 5.0
"""Seconds shutdown gives an evaluation under way."""


def judge(previous: str, reading: Reading | None, rule: AlertRule) -> str:
    """The state an alert's group goes to: fires above `threshold`, clears at `clear` or
    below, stays as it was between the two and while too little traffic says nothing."""
    if reading is None:
        return OK  # no traffic left in the window
    if reading.value is None:
        return previous
    if previous == OK and reading.value > rule.threshold:
        return FIRING
    if previous != OK and reading.value <= rule.clear:
        return OK
    return previous


def budget_level(used: float, budget: Budget) -> str:
    """`ok`, or the highest of `LEVELS` (percent of `limit_usd`) the spend has reached."""
    reached = [level for level in LEVELS if used >= budget.limit_usd * level / 100]
    return str(reached[-1]) if reached else OK


def message(step: Move, rule: AlertRule | Budget) -> str:
    group = f" [{step.group}]" if step.group else ""
    if isinstance(rule, Budget):
        period = f"this {rule.period}"
        if step.state == OK:
            return f"flightrec budget {rule.name}{group}: back under 50% ({step.detail} {period})"
        blocks = (
            "; requests in scope are refused"
            if rule.action == "block" and step.state == "100"
            else ""
        )
        return (
            f"flightrec budget {rule.name}: {step.state}% reached ({step.detail} {period}){blocks}"
        )
    if step.state == FIRING:
        return (
            f"flightrec alert {rule.name}{group} FIRING: {step.detail} "
            f"(threshold {rule.threshold:g}, {rule.kind})"
        )
    return f"flightrec alert {rule.name}{group} cleared: {step.detail} (clears at {rule.clear:g})"


class Watcher:
    """Evaluates `config.alerts` and `config.budgets`; `blocked` is what the relay reads."""

    def __init__(
        self, config: Config, blocked: Blocked, registry: CollectorRegistry | None = None
    ) -> None:
        self.rules = config.alerts
        self.budgets = config.budgets
        self.interval = config.alerts_interval
        self.blocked = blocked
        self.delivery = Delivery()
        self.baselines = Baselines()
        self.failed: str | None = None
        self._firing: Gauge | None = None
        self._value: Gauge | None = None
        if registry is not None:
            labels = ["alert", "group"]
            what = "1 while an alert fires (a budget: while its limit is reached)."
            self._firing = Gauge(
                "flightrec_alert_firing",
                what,
                labels,
                registry=registry,
                multiprocess_mode="livemax",
            )
            what = "What each alert last measured (a budget: USD spent this period)."
            self._value = Gauge(
                "flightrec_alert_value",
                what,
                labels,
                registry=registry,
                multiprocess_mode="livemax",
            )

    def _gauges(self, name: str, group: str, value: float | None, firing: bool) -> None:
        if self._firing is not None and self._value is not None:
            self._firing.labels(name, group).set(1 if firing else 0)
            if value is not None:
                self._value.labels(name, group).set(value)

    async def evaluate(self, engine: AsyncEngine, now: datetime | None = None) -> list[Move]:
        """One round over every rule and budget; the moves this process delivered."""
        now = now or datetime.now(UTC)
        states = await state.current(engine)
        delivered: list[Move] = []
        for rule in self.rules:
            delivered += await self._rule(engine, rule, states, now)
        blocked = []
        for budget in self.budgets:
            used = await spent(engine, budget, now)
            after = budget_level(used, budget)
            previous = states.get((budget.name, ""), OK)
            self._gauges(budget.name, "", used, after == "100")
            if after == "100" and budget.action == "block":
                blocked.append(budget)
            if after != previous:
                detail = f"{money(used)} of {money(budget.limit_usd)}"
                step = Move(budget.name, "", previous, after, used, budget.limit_usd, detail, now)
                if await self._deliver(engine, step, budget):
                    delivered.append(step)
        self.blocked.budgets = tuple(blocked)
        return delivered

    async def _rule(
        self,
        engine: AsyncEngine,
        rule: AlertRule,
        states: dict[tuple[str, str], str],
        now: datetime,
    ) -> list[Move]:
        readings = await measure(engine, rule, now, self.baselines)
        raised = {group for (name, group), at in states.items() if name == rule.name and at != OK}
        delivered = []
        for group in sorted(set(readings) | raised):
            reading = readings.get(group)
            previous = states.get((rule.name, group), OK)
            after = judge(previous, reading, rule)
            value = None if reading is None else reading.value
            self._gauges(rule.name, group, value or 0.0, after != OK)
            if after == previous:
                continue
            detail = reading.detail if reading else f"no traffic over {span(rule.window)}"
            step = Move(rule.name, group, previous, after, value, rule.threshold, detail, now)
            if await self._deliver(engine, step, rule):
                delivered.append(step)
        return delivered

    async def _deliver(self, engine: AsyncEngine, step: Move, rule: AlertRule | Budget) -> bool:
        """Move the state; deliver when this process's move took."""
        if not await state.move(engine, step):
            return False
        firing = step.state != OK
        self.delivery.send(message(step, rule), rule.notify, rule.webhook_url, firing=firing)
        return True

    async def run(self, engine: AsyncEngine, stop: asyncio.Event) -> None:
        """Evaluate every `interval` seconds until `stop` is set."""
        while not stop.is_set():
            try:
                await self.evaluate(engine)
                if self.failed is not None:
                    log.info("alerts: evaluating again")
                self.failed = None
            except Exception as exc:  # the database's errors are many types; all wait a round
                why = describe(exc)
                if why != self.failed:
                    log.warning(
                        "alerts: evaluation failed (%s); next try in %gs", why, self.interval
                    )
                self.failed = why
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)


def background(watcher: Watcher, db_url: str) -> Callable[[web.Application], AsyncIterator[None]]:
    """A `cleanup_ctx` entry running `watcher` as long as the application."""

    async def running(app: web.Application) -> AsyncIterator[None]:
        engine = create_engine(db_url)
        stop = asyncio.Event()
        task = asyncio.create_task(watcher.run(engine, stop), name="flightrec-alerts")
        yield
        stop.set()
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(task, STOP_WAIT)  # a query stuck on the database: cancelled
        await watcher.delivery.stop()
        await engine.dispose()

    return running
