"""What each rule reads from the database: one value per group, over its window.

Every reading is one aggregate statement bounded by time (`exchanges.started_at` is indexed;
`fingerprints` is a row per backend): spend and unpriced counts are the cost report's
(`cost --by` grouping and filters over the window, so an alert and `flightrec cost` always
agree), error rates and confidence are grouped here the same way. Nothing runs per request.

A group missing from a reading had no traffic in the window: a firing alert for it clears.
A group whose value is None had too little (`min_count`): it stays as it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from proxy.alert_rules import AlertRule, Budget, Where
from proxy.store import tables as t
from proxy.store.cost import group_column
from proxy.store.filters import Filters
from proxy.store.report import cost_report


@dataclass(frozen=True, slots=True)
class Reading:
    value: float | None
    """None: too little traffic to judge (fewer than `min_count` exchanges)."""
    detail: str
    """What crossed, for people: the figures behind the value."""


def span(seconds: float) -> str:
    """A duration as rules write it: `90s` as `90s`, `3600s` as `1h`."""
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def money(usd: float) -> str:
    """`$12.50`, `$0.000025`: cents once there are any, else the millionths that matter."""
    return f"${usd:,.2f}" if usd >= 1 else f"${usd:.6f}"


def filters(where: Where, since: datetime, until: datetime | None = None) -> Filters:
    return Filters(
        since=since,
        until=until,
        model=where.model,
        key=where.key,
        tags=where.tags,
        user=where.user,
        upstream=where.upstream,
    )


def _group_name(value: Any) -> str:
    return "(none)" if value is None else str(value)


async def _spend(engine: AsyncEngine, rule: AlertRule, now: datetime) -> dict[str, Reading]:
    since = now - timedelta(seconds=rule.window)
    rows = await cost_report(engine, rule.by or "model", filters(rule.where, since))
    over = span(rule.window)
    if rule.by is None:
        spent = float(sum(row["cost_usd"] or 0 for row in rows))
        return {"": Reading(spent, f"{money(spent)} spent over {over}")} if rows else {}
    found = {}
    for row in rows:
        spent = float(row["cost_usd"] or 0)
        found[_group_name(row["group"])] = Reading(spent, f"{money(spent)} spent over {over}")
    return found


async def _unpriced(engine: AsyncEngine, rule: AlertRule, now: datetime) -> dict[str, Reading]:
    since = now - timedelta(seconds=rule.window)
    rows = await cost_report(engine, rule.by or "model", filters(rule.where, since))
    over = span(rule.window)
    found = {}
    for row in rows:
        count = row["unpriced_requests"]
        if count:
            detail = f"{count} unpriced requests over {over}"
            found[_group_name(row["group"])] = Reading(float(count), detail)
    return found


async def _error_rate(engine: AsyncEngine, rule: AlertRule, now: datetime) -> dict[str, Reading]:
    ex = t.exchanges
    since = now - timedelta(seconds=rule.window)
    group, source = group_column(rule.by or "upstream", engine.dialect.name)
    if rule.by is None:
        group = sa.literal("")
    failed = sa.or_(ex.c.outcome != "ok", ex.c.status >= 500)
    query = (
        sa.select(
            group.label("group"),
            sa.func.count().label("requests"),
            sa.func.sum(sa.case((failed, 1), else_=0)).label("errors"),
        )
        .select_from(source)
        .where(*filters(rule.where, since).where())
        .group_by(group)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    found = {}
    for row in rows:
        requests, errors = int(row.requests), int(row.errors or 0)
        rate = errors / requests if requests >= rule.min_count else None
        detail = f"{errors} of {requests} requests failed over {span(rule.window)}"
        found[_group_name(row.group)] = Reading(rate, detail)
    return found


def _mean_logprobs(where: Where, since: datetime, until: datetime) -> sa.Select[Any]:
    """Per answering model: the mean logprob of the generated tokens and the exchanges."""
    ex, lp = t.exchanges, t.logprobs
    model = sa.func.coalesce(ex.c.response_model, ex.c.model)
    return (
        sa.select(
            model.label("model"),
            sa.func.avg(lp.c.logprob).label("mean"),
            sa.func.count(sa.distinct(ex.c.id)).label("exchanges"),
        )
        .select_from(ex.join(lp, lp.c.exchange_id == ex.c.id))
        .where(
            *filters(where, since, until).where(),
            lp.c.kind == "content",
            lp.c.logprob.is_not(None),
        )
        .group_by(model)
    )


class Baselines:
    """Each confidence rule's baseline per model, read again once it is `REFRESH` seconds (or
    the rule's window, if shorter) old: a day of logprobs moves little in minutes, and it is
    the largest read of all."""

    REFRESH = 300.0

    def __init__(self) -> None:
        self._held: dict[str, tuple[datetime, dict[str, tuple[float, int]]]] = {}

    async def get(
        self, conn: AsyncConnection, rule: AlertRule, since: datetime
    ) -> dict[str, tuple[float, int]]:
        """(mean logprob, exchanges) per model over the `baseline` before `since`."""
        held = self._held.get(rule.name)
        if held is not None and (since - held[0]).total_seconds() < min(self.REFRESH, rule.window):
            return held[1]
        before = since - timedelta(seconds=rule.baseline)
        rows = await conn.execute(_mean_logprobs(rule.where, before, since))
        found = {row.model: (float(row.mean), int(row.exchanges)) for row in rows}
        self._held[rule.name] = (since, found)
        return found


async def _confidence(
    engine: AsyncEngine, rule: AlertRule, now: datetime, baselines: Baselines
) -> dict[str, Reading]:
    since = now - timedelta(seconds=rule.window)
    async with engine.connect() as conn:
        recent = (await conn.execute(_mean_logprobs(rule.where, since, now))).all()
        if not recent:
            return {}
        base = await baselines.get(conn, rule, since)
    found = {}
    for row in recent:
        past = base.get(row.model)
        if past is None or min(row.exchanges, past[1]) < rule.min_count:
            found[_group_name(row.model)] = Reading(None, "no baseline yet")
            continue
        mean, base_mean = float(row.mean), past[0]
        if rule.metric == "perplexity":
            now_ppl, base_ppl = math.exp(-mean), math.exp(-base_mean)
            value = now_ppl - base_ppl
            detail = f"perplexity {now_ppl:.3f} over {span(rule.window)}, baseline {base_ppl:.3f}"
        else:
            value = base_mean - mean
            detail = f"mean logprob {mean:.3f} over {span(rule.window)}, baseline {base_mean:.3f}"
        found[_group_name(row.model)] = Reading(value, detail)
    return found


async def _fingerprints(engine: AsyncEngine, rule: AlertRule, now: datetime) -> dict[str, Reading]:
    """Fingerprints first seen in the window for an upstream and model that had another one
    before: a backend changed behind the model's name."""
    fp = t.fingerprints
    older = fp.alias("older")
    since = now - timedelta(seconds=rule.window)
    query = sa.select(fp.c.upstream, fp.c.model, fp.c.system_fingerprint).where(
        fp.c.first_seen >= since,
        sa.exists().where(
            older.c.upstream == fp.c.upstream,
            older.c.model == fp.c.model,
            older.c.first_seen < fp.c.first_seen,
        ),
    )
    if rule.where.model is not None:
        query = query.where(fp.c.model == rule.where.model)
    if rule.where.upstream is not None:
        query = query.where(fp.c.upstream == rule.where.upstream)
    async with engine.connect() as conn:
        rows = (await conn.execute(query.order_by(fp.c.first_seen))).all()
    new: dict[str, list[str]] = {}
    for row in rows:
        new.setdefault(f"{row.upstream}/{row.model}", []).append(row.system_fingerprint)
    return {
        group: Reading(float(len(seen)), f"new system_fingerprint {', '.join(seen)}")
        for group, seen in new.items()
    }


MEASURES = {
    "spend": _spend,
    "unpriced": _unpriced,
    "error_rate": _error_rate,
    "fingerprint_change": _fingerprints,
}


async def measure(
    engine: AsyncEngine, rule: AlertRule, now: datetime, baselines: Baselines
) -> dict[str, Reading]:
    """The rule's value per group (`""`: the one group of a rule without `by`)."""
    if rule.kind == "confidence":
        return await _confidence(engine, rule, now, baselines)
    return await MEASURES[rule.kind](engine, rule, now)


def period_start(period: str, now: datetime) -> datetime:
    """The start of the calendar day, week (Monday) or month holding `now`, in UTC."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "week":
        return day - timedelta(days=day.weekday())
    if period == "month":
        return day.replace(day=1)
    return day


def budget_where(budget: Budget) -> Where:
    scope, value = budget.scope, budget.scope.value
    if scope.kind == "tag":
        return Where(tags=((scope.tag or "", value),))
    if scope.kind == "key":
        return Where(key=value)
    return Where(user=value) if scope.kind == "user" else Where(model=value)


async def spent(engine: AsyncEngine, budget: Budget, now: datetime) -> float:
    """USD spent in the budget's scope since its period began."""
    since = period_start(budget.period, now)
    rows = await cost_report(engine, "model", filters(budget_where(budget), since))
    return float(sum(row["cost_usd"] or 0 for row in rows))
