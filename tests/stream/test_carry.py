"""`FinishCarry`: a finish chunk waits for the bytes after it, whatever the spelling of its key."""

from __future__ import annotations

from proxy.stream.carry import FinishCarry


def test_a_finish_chunk_waits_however_its_key_is_spelled() -> None:
    first = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    escaped = b'data: {"choices":[{"index":1,"delta":{},"finish\\u005freason":"length"}]}\n\n'
    carry = FinishCarry()
    assert carry.out(first + escaped) == first
    assert carry.flush() == escaped


def test_events_after_the_finish_chunk_send_it_on() -> None:
    finish = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    carry = FinishCarry()
    assert carry.out(finish) == b""
    assert carry.out(b"data: [DONE]\n\n") == finish + b"data: [DONE]\n\n"
    assert carry.flush() == b""
    assert carry.out(finish + b": a comment\n\n") == finish + b": a comment\n\n"
