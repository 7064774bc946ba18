"""Time charts drawn on the server as inline SVG: the x axis runs from the filter's `since` to
its `until` (empty buckets included, ticks on whole hours or days), the y axis has round
ticks and gridlines, and every bucket carries a hover target whose tooltip lists its values.

Everything here is numbers and text for a template (`_timechart.html`); colours are CSS
classes, so no page needs inline style or script.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

WIDTH, HEIGHT = 640, 200
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 12, 28
HOUR, DAY = timedelta(hours=1), timedelta(days=1)
STEPS = (HOUR, 2 * HOUR, 3 * HOUR, 6 * HOUR, 12 * HOUR, DAY, 2 * DAY, 7 * DAY, 14 * DAY)
MOST_TICKS = 8
Fmt = Callable[[float], str]


def significant(value: float, digits: int = 4) -> str:
    """`value` to `digits` significant digits, without trailing zeros ('0.001235', '12.5')."""
    if value == 0 or not math.isfinite(value):
        return "0"
    places = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:,.{places}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def usd(value: float | None) -> str:
    return "unpriced" if value is None else "$" + significant(value)


def count(value: float) -> str:
    return f"{value:,.0f}"


def ms(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f} ms" if value < 10_000 else f"{value / 1000:,.1f} s"


def nice_ticks(peak: float, wanted: int = 4) -> list[float]:
    """0 and round steps (1, 2 or 5 times a power of ten) up to at least `peak`."""
    if peak <= 0:
        return [0.0, 1.0]
    raw = peak / wanted
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    ticks = [0.0]
    while ticks[-1] < peak:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def _time_ticks(first: datetime, end: datetime) -> list[datetime]:
    span = end - first
    step = next((s for s in STEPS if span / s <= MOST_TICKS), STEPS[-1])
    if step >= DAY:
        at = first.replace(hour=0, minute=0, second=0, microsecond=0)
    else:
        hours = int(step / HOUR)
        at = first.replace(hour=first.hour - first.hour % hours, minute=0, second=0, microsecond=0)
    out = []
    while at < end:
        if at >= first:
            out.append(at)
        at += step
    return out


def _tick_label(at: datetime, bucket: str) -> str:
    if bucket == "day" or (at.hour == 0 and at.minute == 0):
        return at.strftime("%b %d")
    return at.strftime("%H:%M")


def chart(
    starts: Sequence[datetime],
    bucket: str,
    series: Sequence[tuple[str, str, Sequence[float | None]]],
    fmt: Fmt,
    *,
    stacked: bool = True,
    lines: bool = False,
    marks: Sequence[datetime] = (),
    missing: str = "n/a",
    quiet_zeros: bool = False,
) -> dict[str, Any]:
    """One chart over the buckets `starts` (each `bucket` long): `series` is (name, css class,
    a value per bucket); bars (stacked or not) or `lines`. `marks`: buckets drawn hatched
    (a pruned day, for one). A tooltip says `missing` for a None value, and leaves out the
    series that are 0 in that bucket when `quiet_zeros`."""
    step = HOUR if bucket == "hour" else DAY
    first = starts[0] if starts else datetime.now().astimezone()
    end = (starts[-1] if starts else first) + step
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    span = (end - first).total_seconds() or 1.0

    def x(at: datetime) -> float:
        return round(LEFT + plot_w * (at - first).total_seconds() / span, 1)

    totals = [sum(v or 0 for _, _, vs in series for v in [vs[i]]) for i in range(len(starts))]
    highs = totals if stacked and not lines else [v or 0 for _, _, vs in series for v in vs]
    ticks = nice_ticks(max(highs, default=0.0))
    top = ticks[-1] or 1.0

    def y(value: float) -> float:
        return round(TOP + plot_h * (1 - value / top), 1)

    width = plot_w * step.total_seconds() / span
    shapes = _lines(starts, series, x, y, width) if lines else _bars(starts, series, x, y, width)
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "left": LEFT,
        "right": WIDTH - RIGHT,
        "top": TOP,
        "bottom": HEIGHT - BOTTOM,
        "yticks": [{"y": y(v), "label": fmt(v)} for v in ticks],
        "xticks": [
            {"x": x(at), "label": _tick_label(at, bucket)} for at in _time_ticks(first, end)
        ],
        "legend": [(name, css) for name, css, _ in series],
        "hover": _hover(starts, series, fmt, x, width, bucket, (missing, quiet_zeros)),
        "marks": [{"x": x(at), "w": round(width, 1)} for at in marks],
        **shapes,
    }


def _bars(
    starts: Sequence[datetime],
    series: Sequence[tuple[str, str, Sequence[float | None]]],
    x: Callable[[datetime], float],
    y: Callable[[float], float],
    width: float,
) -> dict[str, Any]:
    rects = []
    for i, at in enumerate(starts):
        base = 0.0
        for _name, css, values in series:
            value = values[i] or 0.0
            if value <= 0:
                continue
            rects.append(
                {"x": round(x(at) + width * 0.1, 1), "y": y(base + value),
                 "w": round(max(width * 0.8, 0.5), 1), "h": round(y(base) - y(base + value), 1),
                 "css": css}
            )  # fmt: skip
            base += value
    return {"rects": rects, "polylines": [], "dots": []}


def _lines(
    starts: Sequence[datetime],
    series: Sequence[tuple[str, str, Sequence[float | None]]],
    x: Callable[[datetime], float],
    y: Callable[[float], float],
    width: float,
) -> dict[str, Any]:
    polylines, dots = [], []
    for _name, css, values in series:
        runs: list[list[str]] = [[]]
        for at, value in zip(starts, values, strict=True):
            if value is None:
                runs.append([])  # no requests: a gap, not a fall to zero
                continue
            centre = round(x(at) + width / 2, 1)
            runs[-1].append(f"{centre},{y(value)}")
            dots.append({"css": css, "x": centre, "y": y(value)})
        polylines += [{"css": css, "points": " ".join(run)} for run in runs if run]
    return {"rects": [], "polylines": polylines, "dots": dots}


def _hover(
    starts: Sequence[datetime],
    series: Sequence[tuple[str, str, Sequence[float | None]]],
    fmt: Fmt,
    x: Callable[[datetime], float],
    width: float,
    bucket: str,
    says: tuple[str, bool],
) -> list[dict[str, Any]]:
    shown = "%Y-%m-%d %H:00" if bucket == "hour" else "%Y-%m-%d"
    missing, quiet_zeros = says
    out = []
    for i, at in enumerate(starts):
        parts = [
            f"{name}: {missing if values[i] is None else fmt(values[i] or 0.0)}"
            for name, _, values in series
            if not (quiet_zeros and values[i] == 0)
        ]
        tip = at.strftime(shown) + " UTC · " + ", ".join(parts)
        out.append({"x": x(at), "w": round(max(width, 0.5), 1), "tip": tip})
    return out
