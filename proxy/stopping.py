"""How a serving command waits for its end: SIGTERM or SIGINT."""

from __future__ import annotations

import asyncio
import signal


async def until_stopped() -> None:
    """Return once SIGTERM or SIGINT reaches the process (the running loop handles them)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
