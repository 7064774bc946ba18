"""The WebSocket relay's live figures on `/metrics` (SPEC sections 9 and 11): sessions open now
and frames relayed, read from the relay when `/metrics` is scraped.

Each response of a session is an exchange and is counted by `metrics.MetricsSink` like any
other; these two are about the connections themselves. Under `serve --workers` only the
worker that serves the scrape is read (the other figures are summed across workers).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


class Traffic(Protocol):
    """What the relay tells about its WebSocket sessions (`relay.websocket.Sessions`)."""

    def open_count(self) -> int: ...

    def frames(self) -> tuple[int, int]:
        """Frames relayed since start: from clients, from upstreams."""


class _Collector:
    def __init__(self, traffic: Traffic) -> None:
        self._traffic = traffic

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "flightrec_websocket_sessions_open",
            "WebSocket sessions being relayed.",
            value=self._traffic.open_count(),
        )
        frames = CounterMetricFamily(
            "flightrec_websocket_frames",
            "WebSocket frames relayed (text and binary), by direction.",
            labels=["direction"],
        )
        from_clients, from_upstreams = self._traffic.frames()
        frames.add_metric(["client_to_upstream"], from_clients)
        frames.add_metric(["upstream_to_client"], from_upstreams)
        yield frames


def watch(registry: CollectorRegistry, traffic: Traffic) -> None:
    """Serve `traffic`'s figures from `registry`."""
    registry.register(_Collector(traffic))
