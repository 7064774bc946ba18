"""Where each alert stands, in the database: the one judge of who delivers a crossing.

Every process that evaluates the rules (each `serve`, each worker, on any host) reads the
states, measures, and tries to move a row from the state it read to the new one with
`UPDATE alert_state ... WHERE state = <the state it read>`. The database applies such updates
one at a time, so exactly one of the processes that saw the same crossing changes the row; it
alone records the move in `alert_events` (same transaction) and delivers the message. The row
stays after a restart, so a firing alert is not fired again by a process that starts.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.store import tables as t

OK = "ok"
FIRING = "firing"


@dataclass(frozen=True, slots=True)
class Move:
    """An alert's group going from `previous` to `state`."""

    alert: str
    group: str
    previous: str
    state: str
    value: float | None
    threshold: float
    detail: str
    at: datetime


async def current(engine: AsyncEngine) -> dict[tuple[str, str], str]:
    """The state of every (alert, group) that has moved at least once."""
    s = t.alert_state
    async with engine.connect() as conn:
        rows = await conn.execute(sa.select(s.c.alert, s.c.group_key, s.c.state))
        return {(row.alert, row.group_key): row.state for row in rows}


def _insert(dialect: str) -> Any:
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(t.alert_state)


async def move(engine: AsyncEngine, step: Move) -> bool:
    """Apply `step` if the row is still in `step.previous`; True when this call moved it
    (and so must deliver), False when another process did first or the state changed."""
    s = t.alert_state
    async with engine.begin() as conn:
        if step.previous == OK:  # the row's first move: it may not exist yet
            first = {"alert": step.alert, "group_key": step.group, "state": OK}
            await conn.execute(
                _insert(engine.dialect.name)
                .values(**first, changed_at=step.at)
                .on_conflict_do_nothing(index_elements=["alert", "group_key"])
            )
        moved = await conn.execute(
            sa.update(s)
            .where(
                s.c.alert == step.alert,
                s.c.group_key == step.group,
                s.c.state == step.previous,
            )
            .values(
                state=step.state,
                value=step.value,
                threshold=step.threshold,
                detail=step.detail,
                changed_at=step.at,
            )
        )
        if moved.rowcount != 1:
            return False
        await conn.execute(
            sa.insert(t.alert_events).values(
                id=str(uuid.uuid4()),
                at=step.at,
                alert=step.alert,
                group_key=step.group,
                state=step.state,
                previous=step.previous,
                value=step.value,
                threshold=step.threshold,
                detail=step.detail,
            )
        )
    return True


def _row(row: Any) -> dict[str, Any]:
    found = dict(row._mapping)
    found["group"] = found.pop("group_key")
    for name in ("changed_at", "at"):
        if isinstance(found.get(name), datetime):
            found[name] = found[name].isoformat()
    return found


async def states(engine: AsyncEngine) -> list[dict[str, Any]]:
    """Every state row, by alert and group."""
    s = t.alert_state
    query = sa.select(s).order_by(s.c.alert, s.c.group_key)
    async with engine.connect() as conn:
        return [_row(row) for row in await conn.execute(query)]


async def events(engine: AsyncEngine, limit: int = 200) -> list[dict[str, Any]]:
    """The latest moves, newest first."""
    e = t.alert_events
    query = sa.select(e).order_by(e.c.at.desc(), e.c.id).limit(limit)
    async with engine.connect() as conn:
        return [_row(row) for row in await conn.execute(query)]
