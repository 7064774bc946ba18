"""The console's `/`: the overview of spend, requests, errors, latency and time to first token
for a filter, drawn from `store.overview` (the same object as `GET /api/overview`).

Without `since` it shows the last 7 days. An old link to the exchange list (when the list was
`/`) that carries a parameter only the list has (`cursor`, `q`, `outcome`, ...) is sent on to
`/exchanges` with its query.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from proxy.console import axes, params
from proxy.console.pages import render
from proxy.console.state import state
from proxy.keynames import KeyNames
from proxy.store import overview

DEFAULT_SINCE = "7d"
FORM = ("since", "until", "model", "key", "user", "upstream", "tag")
"""The filters the overview's form has; the others are the list's."""
RANGES = ("1h", "24h", "7d", "30d", "90d")


def _link(path: str, pairs: list[tuple[str, str]]) -> str:
    return path + ("?" + urlencode(pairs) if pairs else "")


def _charts(found: dict[str, Any]) -> dict[str, dict[str, Any]]:
    points = found["points"]
    starts = [datetime.fromisoformat(p[0]) for p in points]
    bucket = found["bucket"]
    ok = [float(p[1] - p[2]) for p in points]
    errors = [float(p[2]) for p in points]
    spend = [p[3] for p in points]
    requests_series = [("ok", "c0", ok), ("errors", "bad", errors)]
    latency = [
        ("p50", "c0", [p[4] for p in points]),
        ("p95", "c3", [p[5] for p in points]),
        ("TTFT p50", "c2", [p[6] for p in points]),
    ]
    return {
        "requests": axes.chart(starts, bucket, requests_series, axes.count),
        "spend": axes.chart(starts, bucket, [("spend", "c1", spend)], _usd_tick),
        "latency": axes.chart(starts, bucket, latency, axes.ms, stacked=False, lines=True),
    }


def _usd_tick(value: float) -> str:
    return axes.usd(value)


def _cards(totals: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, value, note) of each figure at the top."""
    requests = totals["requests"]
    rate = totals["errors"] / requests if requests else 0.0
    unpriced = totals["unpriced_requests"]
    return [
        ("Requests", f"{requests:,}", ""),
        ("Spend", axes.usd(totals["cost_usd"]), f"{unpriced:,} unpriced" if unpriced else ""),
        ("Error rate", f"{rate:.1%}", f"{totals['errors']:,} errors"),
        ("Tokens", f"{totals['prompt_tokens'] + totals['completion_tokens']:,}",
         f"{totals['prompt_tokens']:,} prompt · {totals['completion_tokens']:,} completion"),
        ("Latency p50", axes.ms(totals["p50_ms"]), f"p95 {axes.ms(totals['p95_ms'])}"),
        ("TTFT p50", axes.ms(totals["ttft_p50_ms"]), "streams"),
    ]  # fmt: skip


def _tops(
    found: dict[str, Any], shared: list[tuple[str, str]], names: KeyNames
) -> list[dict[str, Any]]:
    """The top lists, each row with its share of the spend and a link to its exchanges."""
    kept = [(k, v) for k, v in shared if k not in ("model", "key", "user", "tag")]
    titles = {"model": "Models", "key": "Keys", "user": "Users", "tag": "Tags"}
    out = []
    for dim, title in titles.items():
        rows = found["top"][dim]
        most = max((r["cost_usd"] or 0 for r in rows), default=0) or 1
        shown = []
        for row in rows:
            value = row["group"]
            label = value
            if dim == "key":
                hint = row.get("key_hint")
                name = names.name(value, hint)
                label = f"{name} ({hint})" if name else (hint or value)
            href = _link("/exchanges", [*kept, (dim, value[:16] if dim == "key" else value)])
            share = round(100 * (row["cost_usd"] or 0) / most)
            shown.append({**row, "label": label, "share": share, "href": href})
        if dim == "key":
            _tell_apart(shown)
        out.append({"title": title, "dim": dim, "rows": shown})
    return out


def _tell_apart(rows: list[dict[str, Any]]) -> None:
    """Two keys can share a label (the same hint, or one name for both): those rows also show
    the start of their key's hash, at least 8 digits and as many as it takes to differ."""
    by_label: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_label.setdefault(row["label"], []).append(row)
    for label, same in by_label.items():
        if len(same) < 2:
            continue
        hashes = [row["group"] for row in same]
        size = 8
        while len({h[:size] for h in hashes}) < len(hashes) and size < max(map(len, hashes)):
            size += 1
        for row, key_hash in zip(same, hashes, strict=True):
            row["label"] = f"{label} #{key_hash[:size]}"


async def overview_view(request: web.Request) -> web.StreamResponse:
    query = request.query
    if any(name not in FORM for name in query):
        raise web.HTTPFound(_link("/exchanges", list(query.items())))
    params.check_known(query, frozenset(FORM))
    filters = params.list_filters(query, state(request).names)
    since_text = query.get("since", "").strip() or DEFAULT_SINCE
    if filters.base.since is None:
        since = datetime.now(UTC) - timedelta(days=7)
        filters = dataclasses.replace(filters, base=dataclasses.replace(filters.base, since=since))
    engine = state(request).db()
    found = await overview.overview(engine, filters, fold_later=state(request).fold_later)
    shared = [(k, v) for k, v in query.items() if v.strip()]
    if not query.get("since", "").strip():
        shared.append(("since", since_text))
    kept = [(k, v) for k, v in shared if k != "since"]
    return render(
        request,
        "overview.html",
        found=found,
        form={k: query.get(k, "") for k in FORM} | {"since": since_text},
        tags=[v for v in query.getall("tag", []) if v.strip()] or [""],
        models=[v for v, _ in await overview.choices(engine, "model")],
        cards=_cards(found["totals"]),
        charts=_charts(found),
        tops=_tops(found, shared, state(request).names),
        ranges=[(r, _link("/", [*kept, ("since", r)]), r == since_text) for r in RANGES],
        list_url=_link("/exchanges", shared),
        filtered=bool([k for k, _ in shared if k != "since"]),
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", overview_view)
