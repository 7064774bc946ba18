"""Server-rendered charts: stacked bars of spend or tokens per time bucket, and each
fingerprint's lifetime as a bar on a time axis. Plain numbers for an inline SVG template;
colours are CSS classes (`c0`..`c7`), so the page needs no inline style."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

COLOURS = 8
WIDTH, HEIGHT, PAD = 860, 220, 40


def _label(group: Any) -> str:
    return "(none)" if group is None else str(group)


def _legend(groups: list[Any]) -> tuple[dict[Any, str], list[tuple[str, str]]]:
    """The first COLOURS - 1 groups keep their own colour, the rest share the last one."""
    colour = {g: f"c{min(i, COLOURS - 1)}" for i, g in enumerate(groups)}
    legend = [(_label(g), colour[g]) for g in groups[: COLOURS - 1]]
    if len(groups) >= COLOURS:
        legend.append((f"{len(groups) - COLOURS + 1} others", f"c{COLOURS - 1}"))
    return colour, legend


def _every_bucket(starts: list[str], bucket: str, most: int = 2400) -> list[str]:
    """The buckets from the first to the last, empty ones included, so the x axis is time;
    just the ones with data when that would be more than `most` bars."""
    step = timedelta(hours=1) if bucket == "hour" else timedelta(days=1)
    first, last = datetime.fromisoformat(starts[0]), datetime.fromisoformat(starts[-1])
    if (last - first) / step >= most:
        return starts
    count = int((last - first) / step) + 1
    return [(first + i * step).isoformat() for i in range(count)]


def stacked_bars(found: dict[str, Any], metric: str) -> dict[str, Any] | None:
    """`metric`: `cost` (point[1]) or `tokens` (prompt + completion). None without data."""
    groups = [s["group"] for s in found["series"]]
    colour, legend = _legend(groups)
    buckets: dict[str, list[tuple[Any, float, str]]] = {}
    for entry in found["series"]:
        for start, cost, _requests, prompt, completion in entry["points"]:
            if metric == "tokens":
                value = float(prompt + completion)
                label = f"{value:,.0f} tokens"
            else:  # a point's cost is None when all of its requests are unpriced
                value, label = cost or 0.0, "unpriced" if cost is None else f"${cost:.6f}"
            buckets.setdefault(start, []).append((entry["group"], value, label))
    if not buckets:
        return None
    starts = _every_bucket(sorted(buckets), found["bucket"])
    peak = max(sum(v for _, v, _ in bars) for bars in buckets.values()) or 1.0
    step = (WIDTH - 2 * PAD) / len(starts)
    bar = max(1.0, step * 0.8)
    rects = []
    for i, start in enumerate(starts):
        top = float(HEIGHT - PAD)
        for group, value, label in buckets.get(start, []):
            h = (HEIGHT - 2 * PAD) * value / peak
            top -= h
            tip = f"{start[:13].replace('T', ' ')} {_label(group)}: {label}"
            rects.append(
                {"x": round(PAD + i * step, 1), "y": round(top, 1), "w": round(bar, 1),
                 "h": round(h, 1), "css": colour[group], "tip": tip}
            )  # fmt: skip
    peak_label = f"${peak:.4f}" if metric == "cost" else f"{peak:,.0f}"
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "pad": PAD,
        "rects": rects,
        "legend": legend,
        "peak": peak_label,
        "first": starts[0][:13].replace("T", " "),
        "last": starts[-1][:13].replace("T", " "),
    }


def fingerprint_lanes(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (upstream, model): each fingerprint's first..last seen on a shared time axis."""
    if not rows:
        return []
    times = [
        datetime.fromisoformat(r[k]).timestamp() for r in rows for k in ("first_seen", "last_seen")
    ]
    low, high = min(times), max(times)
    span = (high - low) or 1.0
    lanes: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        first = datetime.fromisoformat(row["first_seen"]).timestamp()
        last = datetime.fromisoformat(row["last_seen"]).timestamp()
        x = PAD + (WIDTH - 2 * PAD) * (first - low) / span
        w = max(3.0, (WIDTH - 2 * PAD) * (last - first) / span)
        lanes.setdefault((row["upstream"], row["model"]), []).append(
            {**row, "x": round(x, 1), "w": round(w, 1)}
        )
    out = []
    for (upstream, model), bars in lanes.items():
        for i, bar in enumerate(bars):
            bar["y"] = 8 + 22 * i
            bar["css"] = f"c{i % COLOURS}"
        out.append(
            {"upstream": upstream, "model": model, "bars": bars, "height": 16 + 22 * len(bars)}
        )
    return out
