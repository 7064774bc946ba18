"""Delivering a crossing: a log line at once, a webhook post in the background.

The webhook gets a Slack-compatible JSON body, `{"text": "..."}`, posted by a task of its own
and retried with exponential backoff; a webhook that is down, slow or refusing costs its own
task and a log line when it gives up, never anything of the traffic (nothing here runs on
the request path). A webhook URL is often a secret (Slack's is): lines name only its host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from urllib.parse import urlsplit

import aiohttp

log = logging.getLogger("proxy.alerts")

TRIES = 5
BACKOFF = 1.0
"""Seconds before the second try; each later wait doubles."""
TIMEOUT = 10.0
"""Seconds one post may take."""
MAX_PENDING = 100
"""Posts under way at once; more are dropped with a line (a storm has no reader)."""
STOP_GRACE = 5.0
"""Seconds shutdown gives posts under way."""


class Delivery:
    """Sends each message where its rule's `notify` says."""

    def __init__(self, backoff: float = BACKOFF) -> None:
        self._backoff = backoff
        self._session: aiohttp.ClientSession | None = None
        self._pending: set[asyncio.Task[None]] = set()

    def send(self, text: str, notify: Sequence[str], url: str | None, *, firing: bool) -> None:
        if "log" in notify:
            log.log(logging.WARNING if firing else logging.INFO, "%s", text)
        if "webhook" in notify and url is not None:
            if len(self._pending) >= MAX_PENDING:
                log.warning("alert webhook %s: %d posts under way, dropped: %s",
                            _host(url), MAX_PENDING, text)  # fmt: skip
                return
            task = asyncio.create_task(self._post(url, text), name="flightrec-alert-webhook")
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    async def _post(self, url: str, text: str) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT))
        why = ""
        for attempt in range(TRIES):
            if attempt:
                await asyncio.sleep(self._backoff * 2 ** (attempt - 1))
            try:
                async with self._session.post(url, json={"text": text}) as response:
                    if response.status < 300:
                        return
                    why = f"HTTP {response.status}"
                    if 400 <= response.status < 500 and response.status not in (408, 429):
                        break  # refused as sent: the same body will not do better
            except (aiohttp.ClientError, TimeoutError) as exc:
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        log.warning("alert webhook %s: not delivered (%s): %s", _host(url), why, text)

    async def stop(self) -> None:
        """Give posts under way `STOP_GRACE` seconds, then cancel the rest."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=STOP_GRACE)
        for task in list(self._pending):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()
            self._session = None


def _host(url: str) -> str:
    return urlsplit(url).netloc or "?"
