"""The fault tests' TCP relay does what they rely on: relays, stalls with sockets open, cuts."""

from __future__ import annotations

import asyncio

import pytest

from tests.tcprelay import TcpRelay


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data)
        await writer.drain()
    writer.close()


async def test_relay_relays_stalls_and_cuts() -> None:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    target = server.sockets[0].getsockname()[1]
    with TcpRelay() as relay:
        port = relay.start("127.0.0.1", target)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"one")
        assert await asyncio.wait_for(reader.readexactly(3), 5) == b"one"

        await asyncio.to_thread(relay.stall)
        writer.write(b"two")
        with pytest.raises(TimeoutError):  # held, and the connection still open
            await asyncio.wait_for(reader.readexactly(3), 0.3)
        assert not reader.at_eof()
        await asyncio.to_thread(relay.resume)
        assert await asyncio.wait_for(reader.readexactly(3), 5) == b"two"

        await asyncio.to_thread(relay.cut)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # dropped
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)
        await asyncio.to_thread(relay.resume)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"back")
        assert await asyncio.wait_for(reader.readexactly(4), 5) == b"back"
        writer.close()
    server.close()
