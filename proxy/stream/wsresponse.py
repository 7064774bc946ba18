"""What the readers of a WebSocket session hand the relay: one response, complete or left half
way (`WsResponse`), and the bound on what a session's record keeps (`Budget`).

Times are the caller's monotonic clock (`time.perf_counter`): the readers do no I/O and read
no clock, so they can be fed frame by frame in tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

Json = dict[str, Any]
Ending = Literal[
    "ok", "stream_error", "upstream_error", "client_disconnected", "upstream_disconnected"
]


@dataclass(slots=True)
class WsResponse:
    """One response of a session: the request that started it and what came back."""

    request: Json | None
    """The request as recorded (None when the session's record was cut before it)."""
    asked_at: float
    """When the request that started it was relayed (or, for a response the server started by
    itself, when its first event came)."""
    model: str | None = None
    response_id: str | None = None
    response: Json | None = None
    """The response as the server completed it, or as far as it came."""
    usage: Json | None = None
    created_at: float | None = None
    """When its first server event came."""
    first_delta_at: float | None = None
    """When its first generated output came (text, audio, transcript, tool call)."""
    ended_at: float | None = None
    events: int = 0
    """Server events that belonged to it."""
    outcome: Ending = "ok"
    error: str | None = None
    status: int | None = None
    """200 once the server answered it; the status of an `error` event that refused it."""
    cut: bool = False
    """The session's record reached `max_session_record_bytes`: bodies not kept."""
    notes: list[str] = field(default_factory=list)


class Budget:
    """The bytes a session's record may still keep (`max_session_record_bytes`). Once spent,
    every later body is left out, so usage and cost are still recorded and memory stays
    bounded; the frames themselves always pass."""

    __slots__ = ("cut", "left", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit
        self.cut = False

    def spend(self, size: int) -> bool:
        """Whether `size` more bytes may be kept; False from the first time they may not."""
        if self.cut:
            return False
        if size > self.left:
            self.cut = True
            return False
        self.left -= size
        return True

    def note(self) -> str:
        return f"session record cut at max_session_record_bytes ({self.limit})"


def parse(text: bytes) -> Json | None:
    """A frame's JSON object; None for anything else (the frame still passed)."""
    try:
        event = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


def message(error: Any) -> str:
    """One line for an error object: its `message` (also under `error`), else its JSON."""
    if isinstance(error, dict):
        inner = error.get("error", error)
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
    return orjson.dumps(error).decode()


def without_output(response: Json) -> Json:
    """What a cut record keeps of a response: all but its output (usage, status, ids)."""
    return {key: value for key, value in response.items() if key != "output"}
