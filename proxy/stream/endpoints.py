"""One table of the OpenAI endpoints the proxy knows: what it does with each one's answer.

An endpoint is found by the end of the request's path (`/v1/chat/completions` and
`/openai/v1/chat/completions` are the same endpoint); a path in no row is relayed and recorded
as it comes (`OTHER`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.stream.chat import ChatAssembler
from proxy.stream.completions import CompletionAssembler
from proxy.stream.responses import TERMINAL_EVENTS, ResponsesAssembler


class Assembler(Protocol):
    """Folds a stream's events, in order, into the object a non-streamed call returns."""

    @property
    def usage(self) -> dict[str, Any] | None: ...

    @property
    def error(self) -> Any:
        """An error the stream reported in its own shape (not an `error` event), or None."""

    def add(self, chunk: dict[str, Any]) -> bool:
        """Fold one parsed event in; True when it carried generated output (the first token)."""

    def result(self) -> Any: ...


DONE = frozenset({"[DONE]"})


@dataclass(frozen=True, slots=True)
class Endpoint:
    suffix: str
    assembler: Callable[[], Assembler] | None = None
    """Reassembles its streams; None: the events are kept as they came."""
    stream_options: bool = False
    """Takes `stream_options.include_usage`, so the proxy may ask for a stream's usage."""
    ends: frozenset[str] = frozenset()
    """What marks the end of its stream: the `[DONE]` data or the types of its terminal
    events. A stream that ends without one was cut (`upstream_disconnected`); empty: not told."""
    usage: bool = False
    """Its answers report usage: without it the record says usage is missing."""


ENDPOINTS = (
    # Longest suffix first: "/chat/completions" also ends with "/completions".
    Endpoint("/chat/completions", ChatAssembler, stream_options=True, ends=DONE, usage=True),
    Endpoint("/completions", CompletionAssembler, stream_options=True, ends=DONE, usage=True),
    Endpoint("/responses", ResponsesAssembler, ends=TERMINAL_EVENTS, usage=True),
    Endpoint("/embeddings", usage=True),
)
OTHER = Endpoint("")


def endpoint(path: str) -> Endpoint:
    """The endpoint a request path (without its query) is for."""
    for known in ENDPOINTS:
        if path.endswith(known.suffix):
            return known
    return OTHER


FREE_ENDPOINT = "/moderations"
"""Names a model, succeeds and costs nothing: never unpriced."""
