"""What the exchange list shows besides its rows: a line of each prompt and answer, the
summary of the whole filter (the overview's totals), links that sort by a column, times
relative to now, the endpoint in short."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.console import axes
from proxy.keynames import KeyNames
from proxy.store import overview, preview
from proxy.store.browse import ListFilters

COLUMNS = {"time": "newest", "cost": "cost", "duration": "duration", "ttft": "ttft"}
"""Sortable columns and the order a click asks for (a second click on time: oldest)."""


def ago(iso: str, now: datetime | None = None) -> str:
    seconds = ((now or datetime.now(UTC)) - datetime.fromisoformat(iso)).total_seconds()
    for size, unit in ((86400, "d"), (3600, "h"), (60, "min")):
        if seconds >= size:
            return f"{int(seconds // size)} {unit} ago"
    return "just now" if seconds < 5 else f"{int(seconds)} s ago"


def endpoint(path: str) -> str:
    """`/v1/chat/completions` -> `chat/completions`: the path under its prefix."""
    parts = [p for p in path.split("/") if p]
    if len(parts) > 1 and parts[0].startswith("v") and parts[0][1:].isdigit():
        parts = parts[1:]
    return "/".join(parts) or path


def sort_links(pairs: list[tuple[str, str]], current: str) -> dict[str, dict[str, Any]]:
    """Per column: the URL that sorts by it (time toggles newest/oldest), and its state."""
    kept = [(k, v) for k, v in pairs if k not in ("sort", "cursor")]
    out = {}
    for column, order in COLUMNS.items():
        if column == "time" and current == "newest":
            order = "oldest"
        asked = kept if order == "newest" else [*kept, ("sort", order)]
        active = current == order or (column == "time" and current in ("newest", "oldest"))
        arrow = {"oldest": " ↑"}.get(current, " ↓") if active else ""
        out[column] = {"url": "/exchanges?" + urlencode(asked), "arrow": arrow}
    return out


async def summary(
    engine: AsyncEngine, filters: ListFilters, fold_later: overview.FoldLater
) -> list[tuple[str, str]] | None:
    """The filter's totals for the strip above the list; None for a text search (it would
    read every stored prompt for figures nobody asked for)."""
    if filters.q:
        return None
    totals = (await overview.overview(engine, filters, fold_later=fold_later))["totals"]
    requests = totals["requests"]
    rate = totals["errors"] / requests if requests else 0.0
    return [
        ("requests", f"{requests:,}"),
        ("spend", axes.usd(totals["cost_usd"])),
        ("errors", f"{totals['errors']:,} ({rate:.1%})"),
        ("tokens", f"{totals['prompt_tokens'] + totals['completion_tokens']:,}"),
        ("p50", axes.ms(totals["p50_ms"])),
        ("p95", axes.ms(totals["p95_ms"])),
        ("unpriced", f"{totals['unpriced_requests']:,}"),
    ]


async def decorate(engine: AsyncEngine, items: list[dict[str, Any]], names: KeyNames) -> None:
    """Add `ago`, `endpoint`, `key_name` and the `prompt`/`answer` lines to each item."""
    lines = await preview.previews(engine, [item["id"] for item in items])
    now = datetime.now(UTC)
    for item in items:
        item["key_name"] = names.name(item["key_hash"], item["key_hint"])
        item["ago"] = ago(item["started_at"], now)
        item["endpoint"] = endpoint(item["path"])
        item["prompt"], item["answer"] = lines.get(item["id"], ("", ""))
