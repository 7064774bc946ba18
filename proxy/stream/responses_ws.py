"""Reading a session of the Responses API's WebSocket mode (`/v1/responses`) into its
responses (SPEC section 11).

The client sends `response.create` events, each with the body a `POST /v1/responses` would
carry; the server answers each with the events of a streamed `POST /v1/responses`, from
`response.created` to `response.completed` / `response.failed` / `response.incomplete`, folded
here by the same assembler as the HTTP stream (`ResponsesAssembler`). So each response is
recorded as the streamed `POST /v1/responses` it stands for: its request is the
`response.create` event without its WebSocket envelope (`type`, `stream_id`) and with
`"stream": true`.

Lanes: a `response.create` may name a `stream_id`; requests of one lane are answered in order
(FIFO) and every event of the response echoes the lane, so several responses in flight on one
socket are kept apart by lane, one response at a time in each; a terminal event names its
response by id. Requests without a `stream_id` share the default lane. An `error` event on a
lane with a request waiting and no response under way refused that request.

Pure: no I/O, no clock (the caller passes its monotonic time).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from proxy.stream.responses import TERMINAL_EVENTS, ResponsesAssembler
from proxy.stream.wsresponse import Budget, Json, WsResponse, message, parse, without_output

_STARTS = frozenset({"response.created", "response.queued", "response.in_progress"})
_ENVELOPE = frozenset({"type", "stream_id"})
"""Keys of a `response.create` event that a `POST /v1/responses` body does not have."""


@dataclass(slots=True)
class _Asked:
    body: Json
    asked_at: float
    size: int


@dataclass(slots=True)
class _Live:
    asked: _Asked | None
    out: WsResponse
    assembler: ResponsesAssembler


class ResponsesWsReader:
    def __init__(self, *, budget: Budget) -> None:
        self._budget = budget
        self._asked: dict[str | None, deque[_Asked]] = {}
        self._live: dict[str | None, _Live] = {}

    def from_client(self, text: bytes, now: float) -> list[WsResponse]:
        """A client frame the upstream was sent; returns nothing (kept for the same shape as
        `from_server`)."""
        event = parse(text)
        if event is None or event.get("type") != "response.create":
            return []
        lane = _lane(event)
        body = {key: value for key, value in event.items() if key not in _ENVELOPE}
        body["stream"] = True
        self._asked.setdefault(lane, deque()).append(_Asked(body, now, len(text)))
        return []

    def from_server(self, text: bytes, now: float) -> list[WsResponse]:
        """A server frame the client was sent; the responses it completed."""
        event = parse(text)
        if event is None:
            return []
        kind = event.get("type")
        lane = _lane(event)
        live = self._live.get(lane)
        if live is None:
            if kind == "error":
                return self._refused(lane, event, now)
            if kind not in _STARTS:
                return []
            live = self._live[lane] = self._start(lane, now)
        out = live.out
        out.events += 1
        response = event.get("response")
        if isinstance(response, dict) and isinstance(response.get("id"), str):
            out.response_id = response["id"]
        if self._budget.cut and not isinstance(response, dict) and kind != "error":
            return []  # past the bound: only what carries the response, its usage or an error
        if not isinstance(response, dict) and not self._budget.spend(len(text)):
            out.cut = True
        if live.assembler.add(event) and out.first_delta_at is None:
            out.first_delta_at = now
        if kind in TERMINAL_EVENTS or kind == "error":
            del self._live[lane]
            return [self._finish(live, now)]
        return []

    def end(self, outcome: str, error: str, now: float) -> list[WsResponse]:
        """The session is over: each response still under way, as far as it came."""
        ended = []
        for live in self._live.values():
            out = self._finish(live, now)
            out.outcome = outcome  # type: ignore[assignment]
            out.error = error
            ended.append(out)
        self._live.clear()
        return ended

    def _start(self, lane: str | None, now: float) -> _Live:
        waiting = self._asked.get(lane)
        asked = waiting.popleft() if waiting else None
        model = asked.body.get("model") if asked is not None else None
        out = WsResponse(
            None, asked.asked_at if asked else now, model=model if isinstance(model, str) else None
        )
        out.created_at, out.status = now, 200
        return _Live(asked, out, ResponsesAssembler())

    def _refused(self, lane: str | None, event: Json, now: float) -> list[WsResponse]:
        waiting = self._asked.get(lane)
        if not waiting:
            return []
        live = self._start(lane, now)
        live.assembler.add(event)
        out = self._finish(live, now)
        out.outcome = "upstream_error"
        status = event.get("status")
        out.status = status if isinstance(status, int) else 400
        return [out]

    def _finish(self, live: _Live, now: float) -> WsResponse:
        out = live.out
        out.ended_at = now
        assembler = live.assembler
        response = assembler.result()
        out.usage = assembler.usage
        error = assembler.error
        if error is not None:
            out.outcome = "stream_error"
            out.error = message(error)
        elif not assembler.finished:
            out.outcome = "upstream_disconnected"
        if isinstance(response, dict) and isinstance(response.get("model"), str):
            out.model = out.model or response["model"]
        asked = live.asked
        if asked is not None and self._budget.spend(asked.size) and not out.cut:
            out.request = asked.body
            out.response = response
        else:
            out.cut = out.cut or asked is not None
            out.request = None
            out.response = without_output(response) if isinstance(response, dict) else None
        if out.cut:
            out.notes.append(self._budget.note())
        if asked is None:
            out.notes.append("started by the server, without a response.create of its own")
        return out


def _lane(event: Json) -> str | None:
    lane = event.get("stream_id")
    return lane if isinstance(lane, str) else None
