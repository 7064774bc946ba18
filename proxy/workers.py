"""`serve --workers N`: N proxy processes sharing one port (SO_REUSEPORT) and one database.

Each worker is a whole flightrec — its own event loop, upstream pool and background writer —
so nothing one worker knows is needed by another: exchanges are independent and the database
is the only shared state. Each worker journals to its own file (`<spool_path>.<n>`), so no two
processes ever append to or read the same journal. The supervisor migrates the database once
before the workers start (if it does not answer yet, each worker does, one at a time, once it
does), forwards SIGTERM/SIGINT to them and exits when they all have.
Metrics are the one thing summed across workers: each writes its values to files in a fresh
directory the supervisor makes (`PROMETHEUS_MULTIPROC_DIR`), which worker 0's console reads.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
from dataclasses import replace
from types import FrameType

from proxy.config import Config
from proxy.logs import log_to_stderr
from proxy.sinks.metrics import MULTIPROC_ENV, worker_gone

log = logging.getLogger(__name__)


def worker_config(config: Config, index: int) -> Config:
    """Worker 0 alone serves the console and prunes: one console and one pruner whatever N
    is."""
    console_port = config.console_port if index == 0 else 0
    return replace(
        config,
        spool_path=f"{config.spool_path}.{index}",
        console_port=console_port,
        retention_days=config.retention_days if index == 0 else 0,
        retention_bodies_days=config.retention_bodies_days if index == 0 else 0,
    )


def _worker(config: Config, index: int) -> None:
    from proxy.serve import run  # imported in the child process

    log_to_stderr(config.log_level, prefix=f"worker-{index} ")
    asyncio.run(run(worker_config(config, index), reuse_port=True))


def supervise(config: Config) -> int:
    """Run `config.workers` worker processes until a signal stops them; returns the exit code."""
    if config.auto_upgrade:
        from proxy.store import Unreachable, upgrade  # only serve needs the database

        try:
            asyncio.run(upgrade(config.db_url))
            config = replace(config, auto_upgrade=False)  # done: the workers only check
        except Unreachable as exc:  # each worker upgrades once it answers, one at a time
            log.warning("%s: the workers upgrade the schema once it answers", exc)
    # Set before the workers start, so prometheus_client in each of them writes to files.
    metrics_dir = os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="flightrec-metrics-")
    context = multiprocessing.get_context("spawn")
    workers = [
        context.Process(target=_worker, args=(config, i), name=f"flightrec-worker-{i}")
        for i in range(config.workers)
    ]

    def stop(signum: int, frame: FrameType | None) -> None:
        log.info("stopping %d workers", len(workers))
        for process in workers:
            if process.is_alive():
                process.terminate()  # SIGTERM: each worker shuts down gracefully

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for process in workers:
            process.start()
        log.info("flightrec: %d workers on %s:%d", len(workers), config.host, config.port)
        for process in workers:
            process.join()
            worker_gone(process.pid, metrics_dir)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(metrics_dir, ignore_errors=True)
    failed = [p.name for p in workers if p.exitcode not in (0, -signal.SIGTERM)]
    if failed:
        log.error("workers exited with an error: %s", ", ".join(failed))
        return 1
    return 0
