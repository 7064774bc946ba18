"""One exchange, looked at closely: its logprobs per choice and its stream's timeline.

Both read the projections the writer keeps (`logprobs` rows, `raw_streams.pacing`) and return
the objects of `GET /api/exchanges/{id}/logprobs` and `/timeline` (SPEC section 8).
"""

from __future__ import annotations

import math
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.store import tables as t


def _stats(values: list[float]) -> dict[str, float | None]:
    """min and mean logprob, and perplexity = exp(-mean); None without a single logprob."""
    if not values:
        return {"min": None, "mean": None, "perplexity": None}
    mean = sum(values) / len(values)
    try:
        perplexity: float | None = math.exp(-mean)
    except OverflowError:
        perplexity = None  # not representable; the mean says enough
    return {"min": min(values), "mean": mean, "perplexity": perplexity}


async def logprobs(engine: AsyncEngine, exchange_id: str) -> dict[str, Any]:
    """`{"choices": [{"index", "kind", "tokens": [...], "min", "mean", "perplexity"}]}`, one
    entry per choice and kind (`content`, `refusal`) that has logprobs."""
    lp = t.logprobs
    query = (
        sa.select(lp.c.choice_index, lp.c.kind, lp.c.position, lp.c.token, lp.c.logprob)
        .add_columns(lp.c.top_logprobs)
        .where(lp.c.exchange_id == exchange_id)
        .order_by(lp.c.choice_index, lp.c.kind, lp.c.position)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    grouped: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault((row.choice_index, row.kind), []).append(
            {
                "position": row.position,
                "token": row.token,
                "logprob": row.logprob,
                "top_logprobs": row.top_logprobs or [],
            }
        )
    choices = []
    for (index, kind), tokens in grouped.items():
        finite = [
            tok["logprob"]
            for tok in tokens
            if isinstance(tok["logprob"], float) and math.isfinite(tok["logprob"])
        ]
        choices.append({"index": index, "kind": kind, "tokens": tokens, **_stats(finite)})
    return {"choices": choices}


async def timeline(engine: AsyncEngine, exchange_id: str) -> dict[str, Any]:
    """`{"pacing": [[bytes, ms], ...], "ttft_ms", "duration_ms"}`: bytes the client had
    received by each write, and when; empty pacing when the stream's bytes were not kept."""
    ex, raw = t.exchanges, t.raw_streams
    query = (
        sa.select(ex.c.ttft_ms, ex.c.duration_ms, raw.c.pacing)
        .select_from(ex.outerjoin(raw, raw.c.exchange_id == ex.c.id))
        .where(ex.c.id == exchange_id)
    )
    async with engine.connect() as conn:
        row = (await conn.execute(query)).first()
    if row is None:
        return {"pacing": [], "ttft_ms": None, "duration_ms": None}
    pacing = [[int(offset), float(ms)] for offset, ms in row.pacing or []]
    return {"pacing": pacing, "ttft_ms": row.ttft_ms, "duration_ms": row.duration_ms}
