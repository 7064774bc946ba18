"""One session (SPEC section 8): `GET /api/sessions/{id}` and the console's `/sessions/{id}`.

A session's exchanges are those whose `session` is its id, and, for a chain the writer linked
(`threads.py`), the first exchange itself, whose id the chain took. `kind` says what grouped
them: `websocket` (one WebSocket connection), `chat` (a chat continued turn by turn),
`responses` (a `previous_response_id` chain) or `header` (`X-Flightrec-Session`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.store import browse
from proxy.store import tables as t
from proxy.store.engine import StoreError
from proxy.store.facets import cost_nano

MOST = 2000
"""Exchanges listed at most (the newest); the totals are of those."""
USAGE = ("prompt_tokens", "cached_tokens", "completion_tokens", "reasoning_tokens")


def kind_of(session_id: str, items: list[dict[str, Any]], websocket: bool) -> str:
    if websocket:
        return "websocket"
    first = next((item for item in items if item["id"] == session_id), None)
    if first is None:
        return "header"
    return "responses" if str(first["path"]).endswith("/responses") else "chat"


def totals(items: list[dict[str, Any]]) -> tuple[float | None, dict[str, int]]:
    """The exact sum of the costs (None when none has one but some should), and usage."""
    costs = [item["cost_usd"] for item in items if item["cost_usd"] is not None]
    nano = sum(cost_nano(cost) for cost in costs)
    usage = {name: sum(int(item.get(name) or 0) for item in items) for name in USAGE}
    unknown = not costs and any(item.get("prompt_tokens") is not None for item in items)
    return (None if unknown else float(Decimal(nano) * Decimal("1e-9"))), usage


def _end(item: dict[str, Any]) -> datetime:
    took = timedelta(milliseconds=item["duration_ms"] or 0)
    return datetime.fromisoformat(item["started_at"]) + took


async def get_session(engine: AsyncEngine, session_id: str) -> dict[str, Any]:
    """`{"id", "kind", "exchanges", "started_at", "ended_at", "cost_usd", "usage"}`, the
    exchanges oldest first (`logs --json` objects); StoreError when none has that session."""
    found, _ = await browse.list_page(engine, browse.ListFilters(session=session_id), limit=MOST)
    if not found:
        raise StoreError(f"no session with id {session_id!r}")
    items = list(reversed(found))
    cost, usage = totals(items)
    ex = t.exchanges
    relayed = sa.or_(ex.c.upstream_url.startswith("ws"), ex.c.path.endswith("/realtime"))
    query = sa.select(ex.c.id).where(ex.c.session == session_id, relayed).limit(1)
    async with engine.connect() as conn:
        websocket = (await conn.execute(query)).first() is not None
    ends = [
        datetime.fromisoformat(item["started_at"])
        + timedelta(milliseconds=item["duration_ms"] or 0)
        for item in items
    ]
    return {
        "id": session_id,
        "kind": kind_of(session_id, items, websocket),
        "exchanges": items,
        "started_at": items[0]["started_at"],
        "ended_at": max(ends).isoformat(),
        "cost_usd": cost,
        "usage": usage,
    }


async def session_of(engine: AsyncEngine, shown: dict[str, Any]) -> str | None:
    """The session an exchange (a `show --json` object) is in: its own, or its id when it
    started a chain that later turns joined."""
    if shown.get("session"):
        return str(shown["session"])
    ex = t.exchanges
    query = sa.select(ex.c.id).where(ex.c.session == shown["id"]).limit(1)
    async with engine.connect() as conn:
        return shown["id"] if (await conn.execute(query)).first() is not None else None
