"""A TCP relay for fault tests: sits in front of a server (PostgreSQL) on a free loopback port
and can stall (stop moving bytes, keep every socket open) or cut (drop every connection and
refuse new ones) the traffic through it.

It runs its own event loop in a daemon thread, so sync tests driving a subprocess and async
tests driving a recorder in their own loop use it the same way:

    relay = TcpRelay()
    port = relay.start("127.0.0.1", 5432)
    relay.stall(); relay.resume(); relay.cut(); relay.resume()
    relay.close()
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any

_CALL_TIMEOUT = 10.0
"""Seconds a call from the test's thread waits for the relay's loop."""


class TcpRelay:
    def __init__(self) -> None:
        self.port = 0
        self._target: tuple[str, int] = ("127.0.0.1", 0)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._flowing: asyncio.Event | None = None
        self._transports: set[asyncio.WriteTransport] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def __enter__(self) -> TcpRelay:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def start(self, target_host: str, target_port: int) -> int:
        """Listen on a free loopback port relaying to the target; returns the port."""
        self._target = (target_host, target_port)
        self._thread.start()
        self._call(self._listen())
        return self.port

    def stall(self) -> None:
        """Stop moving bytes either way; connections stay open, new ones are accepted and held."""
        self._call(self._set_flowing(False))

    def resume(self) -> None:
        """Move bytes again after `stall`, and listen again (same port) after `cut`."""
        self._call(self._resume())

    def cut(self) -> None:
        """Drop every connection (a reset) and stop listening until `resume`."""
        self._call(self._cut())

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._cut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(_CALL_TIMEOUT)
        self._loop.close()

    @property
    def connections(self) -> int:
        """Sockets open through the relay (two per relayed connection)."""
        return len(self._transports)

    def _call(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(_CALL_TIMEOUT)

    async def _listen(self) -> None:
        if self._flowing is None:
            self._flowing = asyncio.Event()
            self._flowing.set()
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _set_flowing(self, flowing: bool) -> None:
        assert self._flowing is not None
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _resume(self) -> None:
        if self._server is None:
            await self._listen()
        await self._set_flowing(True)

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for transport in list(self._transports):
            transport.abort()
        self._transports.clear()
        for task in list(self._tasks):
            task.cancel()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._transports.add(writer.transport)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            self._transports.discard(writer.transport)
            return
        self._transports.add(up_writer.transport)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        try:
            while True:
                await self._flowing.wait()
                data = await reader.read(65536)
                if not data:
                    break
                await self._flowing.wait()  # bytes read just before a stall are held too
                writer.write(data)
                await writer.drain()
        except (OSError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.transport.abort()
            self._transports.discard(writer.transport)
