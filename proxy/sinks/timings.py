"""A labelled histogram's observations held between two samples of the metrics
(`metrics.MetricsSink.sample`), as the sink holds its counters' (`metrics._Series`)."""

from __future__ import annotations

import bisect
import math
from typing import Any

from prometheus_client import Histogram


class HeldTimings:
    """A labelled histogram's observations since the last `flush`, held as counts by bucket
    and their sum: `Histogram.observe` takes two locks and five calls a value, and an exchange
    observes two or three. `flush` adds them to the histogram's own values, the ones `observe`
    adds to (prometheus_client's `_buckets` and `_sum`, also under `serve --workers`); a value
    lands in the bucket `observe` would put it in, the first bound not below it (NaN in none)."""

    __slots__ = ("_bounds", "_child", "_counts", "_sum", "observe")

    def __init__(self, child: Histogram, bounds: tuple[float, ...]) -> None:
        self._child = child
        self._bounds = (*bounds, math.inf)
        self._counts = [0] * len(self._bounds)
        self._sum: float | None = None
        held = hasattr(child, "_buckets") and hasattr(child, "_sum")
        # A prometheus_client without those values observes each value as it comes.
        self.observe = self._hold if held else child.observe

    def _hold(self, amount: float) -> None:
        bounds = self._bounds
        at = bisect.bisect_left(bounds, amount)
        if at < len(bounds) and amount <= bounds[at]:
            self._counts[at] += 1
        self._sum = amount if self._sum is None else self._sum + amount

    def flush(self) -> None:
        held = self._sum
        if held is None:
            return
        self._sum = None
        child: Any = self._child
        child._sum.inc(held)
        counts = self._counts
        for at, count in enumerate(counts):
            if count:
                child._buckets[at].inc(count)
                counts[at] = 0
