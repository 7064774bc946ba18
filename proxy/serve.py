"""serve: the relay, its sinks, the console, retention and alerts, until SIGTERM or SIGINT."""

from __future__ import annotations

import gc
import logging
import sys

from aiohttp import web

from proxy.alerts.watch import Watcher
from proxy.alerts.watch import background as alerts_background
from proxy.config import Config
from proxy.console import listen, start_console
from proxy.relay.app import build_app, make_runner
from proxy.relay.appkeys import APP_BLOCKED, APP_IN_FLIGHT
from proxy.relay.inflight import stop_relay
from proxy.relay.websocket import APP_WS_SESSIONS
from proxy.sinks.fanout import Recorder, Sink
from proxy.sinks.metrics import MetricsSink
from proxy.sinks.otlp import OtlpExporter
from proxy.sinks.wsmetrics import watch as watch_websockets
from proxy.stopping import until_stopped
from proxy.store.ahead import keep_ahead
from proxy.store.recorder import open_recorder
from proxy.store.retention import background

log = logging.getLogger(__name__)


def tune_gc() -> None:
    """Tune the cyclic garbage collector for a long-running server (docs/performance.md).

    Everything alive after start-up (SQLAlchemy, alembic, aiohttp and their caches) lives as
    long as the process: `gc.freeze()` takes it out of every later collection. Each exchange
    allocates many short-lived containers, so young collections run every 20,000 allocations
    (Python's default is 700).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 20)


SWITCH_INTERVAL = 0.001
"""Seconds a thread waiting for the GIL lets the loop's thread keep it before asking for it
(Python's default is 0.005; docs/performance.md)."""


def tune_threads() -> None:
    """Make a worker thread the loop waits on (the SQLite writer's COMMIT, WAL checkpoints,
    journal reads) get the GIL soon behind a busy loop.

    A waiting thread asks the loop's thread to hand the GIL over only after waiting a whole
    switch interval with no release in between; but the loop's thread lets go of the GIL for
    a moment at every poll of its sockets, which wakes the waiting thread and starts its wait
    anew, and takes the GIL back before that thread runs. Behind a loop whose turns take a
    few milliseconds of CPU each, a COMMIT can wait seconds for the GIL this way. A shorter
    interval than the turns lets the waiting thread ask in time."""
    sys.setswitchinterval(SWITCH_INTERVAL)


async def run(
    config: Config, recorder: Recorder | None = None, *, reuse_port: bool = False
) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully."""
    if recorder is None:
        recorder = await open_recorder(config, wait_for_database=True)
    metrics = MetricsSink(config, recorder)
    sinks: list[Sink] = [metrics]
    if config.otlp_endpoint:
        sinks.append(OtlpExporter(config, dropped=metrics.spans_dropped))
    app = build_app(config, recorder, sinks=sinks)
    watch_websockets(metrics.registry, app[APP_WS_SESSIONS])
    if config.db_url.startswith("postgresql"):
        app.cleanup_ctx.append(keep_ahead(config))
    if config.retention_days or config.retention_bodies_days:
        app.cleanup_ctx.append(background(config))
    if config.alerts or config.budgets:
        watcher = Watcher(config, app[APP_BLOCKED], metrics.registry)
        app.cleanup_ctx.append(alerts_background(watcher, config.db_url))
    runner = make_runner(app, config)
    tune_gc()
    tune_threads()
    await runner.setup()
    # A burst of new connections waits in the kernel's accept queue until the loop takes it;
    # aiohttp's default of 128 overflows, and the kernel then drops connections that clients
    # retry seconds later. Past `max_connections` they are answered 503 (`relay.load`). The
    # kernel caps the queue at net.core.somaxconn.
    site = web.TCPSite(
        runner,
        config.host,
        config.port,
        backlog=config.max_connections,
        reuse_port=reuse_port or None,
    )
    try:
        await listen(site, "port (--port)")
    except BaseException:
        await runner.cleanup()
        raise
    # the console has its own listener: console_host:console_port
    try:
        console = await start_console(config, metrics, wait_for_database=True)
    except BaseException:
        await runner.cleanup()
        raise
    log.info(
        "flightrec listening on http://%s:%d, upstreams: %s",
        config.host,
        config.port,
        ", ".join(f"{u.prefix} -> {u.base_url}" for u in config.upstreams),
    )
    try:
        await until_stopped()
        log.info("stopping: finishing in-flight exchanges (up to %.0fs)", config.shutdown_grace)
    finally:
        await stop_relay(runner, app[APP_IN_FLIGHT], config.shutdown_grace)
        if console is not None:
            await console.cleanup()
