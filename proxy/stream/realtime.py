"""Reading a Realtime API session (`/v1/realtime`) into its responses (SPEC section 11).

`RealtimeReader` is told every text frame of the session, client's and server's, after the
relay has passed it on, and hands back each response once the server says it is done
(`response.done`). Pure: no I/O, no clock (the caller passes its monotonic time).

- A response's request is the client's `response.create` event with what the client set up
  before it: the session configuration in effect (as the server confirmed it in
  `session.created` / `session.updated`), the conversation items the client added since the
  previous `response.create` (`conversation.item.create`), and the input audio it appended.
  A response the server started by itself (voice activity detection) gets the same, without
  a `response.create`.
- `response.create` events are answered in order (`response.created`); a `response.create`
  the server refused (an `error` event naming its `event_id`) is a response of its own, with
  outcome `upstream_error`. Events of a response carry its `response_id`: several responses
  in flight (out-of-band ones) are kept apart by it.
- Both the GA event names (`response.output_text.delta`, `response.output_audio.delta`,
  `response.output_audio_transcript.delta`, `conversation.item.added`) and the beta ones
  (`response.text.delta`, `response.audio.delta`, `response.audio_transcript.delta`,
  `conversation.item.created`) are read.
- Audio is counted (bytes, and seconds from the session's audio format) and kept only when
  `store_audio` is set: input audio in the request's `input_audio`, output audio in the
  `audio` of the output content part it streamed into.
"""

from __future__ import annotations

import base64
import binascii
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from proxy.stream.wsresponse import Budget, Json, WsResponse, message, parse, without_output

MAX_ITEMS = 64
"""Conversation items kept for the next response's request; older ones are counted only."""

_FIRST_OUTPUT = frozenset(
    {
        "response.output_text.delta",
        "response.output_audio.delta",
        "response.output_audio_transcript.delta",
        "response.function_call_arguments.delta",
        "response.text.delta",
        "response.audio.delta",
        "response.audio_transcript.delta",
    }
)
"""Events that carry generated output: the first of them is the response's first delta."""
_STRING_OF = {
    "response.output_text.delta": "text",
    "response.text.delta": "text",
    "response.output_audio_transcript.delta": "transcript",
    "response.audio_transcript.delta": "transcript",
    "response.function_call_arguments.delta": "arguments",
}
"""Deltas of strings a response left half way is rebuilt from, and the key each fills."""
_AUDIO_OUT = frozenset({"response.output_audio.delta", "response.audio.delta"})
_PCM16_RATE = 24_000
_BYTES_PER_SECOND = {
    "audio/pcm": 2 * _PCM16_RATE,
    "pcm16": 2 * _PCM16_RATE,
    "audio/pcmu": 8_000,
    "audio/pcma": 8_000,
    "g711_ulaw": 8_000,
    "g711_alaw": 8_000,
}
"""Mono audio formats the Realtime API takes (GA `audio/*` types, beta names)."""


def audio_size(encoded: str) -> int:
    """Bytes of audio in a base64 string, without decoding it."""
    size = len(encoded) * 3 // 4
    if encoded.endswith("=="):
        return size - 2
    return size - 1 if encoded.endswith("=") else size


@dataclass(slots=True)
class Audio:
    """Audio counted for one direction of one response, and its bytes when they are kept."""

    size: int = 0
    kept: list[bytes] | None = None

    def add(self, encoded: str, keep: bool) -> None:
        self.size += audio_size(encoded)
        if keep:
            try:
                piece = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                return
            if self.kept is None:
                self.kept = []
            self.kept.append(piece)

    def record(self, bytes_per_second: int | None) -> Json:
        out: Json = {"bytes": self.size}
        if bytes_per_second:
            out["seconds"] = round(self.size / bytes_per_second, 3)
        if self.kept is not None:
            out["audio"] = base64.b64encode(b"".join(self.kept)).decode()
        return out


@dataclass(slots=True)
class _Asked:
    """A `response.create` (or what a server-started response answers): the request so far."""

    create: Json | None
    asked_at: float
    items: list[Json]
    items_dropped: int
    audio: Audio
    size: int


@dataclass(slots=True)
class _Live:
    asked: _Asked
    out: WsResponse
    audio: dict[tuple[str, int], Audio] = field(default_factory=dict)
    """Output audio by (item id, content index)."""
    items: dict[str, Json] = field(default_factory=dict)
    """Output items as `response.output_item.added` gave them, by id."""
    strings: dict[tuple[str, int, str], list[str]] = field(default_factory=dict)
    """Streamed text, transcript and arguments by (item id, content index, key): the output of
    a response left half way."""


class RealtimeReader:
    def __init__(self, model: str | None, *, store_audio: bool, budget: Budget) -> None:
        self.model = model
        """The `model` of the connection's query, until the session names its own."""
        self._store_audio = store_audio
        self._budget = budget
        self._session: Json | None = None
        self._session_size = 0
        self._in_rate: int | None = _BYTES_PER_SECOND["pcm16"]
        self._out_rate: int | None = _BYTES_PER_SECOND["pcm16"]
        self._items: list[Json] = []
        self._sizes: deque[int] = deque()
        self._items_size = 0
        self._items_dropped = 0
        self._audio = Audio()
        self._asked: deque[_Asked] = deque()
        self._live: dict[str, _Live] = {}

    def from_client(self, text: bytes, now: float) -> list[WsResponse]:
        """A client frame the upstream was sent; returns nothing (kept for the same shape as
        `from_server`)."""
        event = parse(text)
        kind = event.get("type") if event else None
        if kind == "input_audio_buffer.append":
            audio = event.get("audio") if event else None
            if isinstance(audio, str):
                self._audio.add(audio, self._store_audio and not self._budget.cut)
        elif kind == "conversation.item.create":
            self._add_item(event.get("item") if event else None, len(text))
        elif kind == "response.create" and event is not None:
            self._asked.append(self._ask(event, now, len(text)))
        return []

    def from_server(self, text: bytes, now: float) -> list[WsResponse]:
        """A server frame the client was sent; the responses it completed."""
        event = parse(text)
        if event is None:
            return []
        kind = event.get("type")
        if kind in ("session.created", "session.updated"):
            self._configured(event.get("session"), len(text))
            return []
        if kind == "response.created":
            self._created(event.get("response"), now)
            return []
        if kind == "response.done":
            return self._done(event.get("response"), now, len(text))
        if kind == "error":
            return self._refused(event, now)
        live = self._live.get(event.get("response_id") or "")
        if live is not None:
            self._event(live, kind, event, now)
        return []

    def end(self, outcome: str, error: str, now: float) -> list[WsResponse]:
        """The session is over: each response still under way, as far as it came."""
        ended = []
        for live in self._live.values():
            out = live.out
            out.outcome = outcome  # type: ignore[assignment]
            out.error = error
            out.ended_at = now
            out.request = self._request(live)
            if out.response is not None and not out.cut:
                out.response = {**out.response, "output": _partial_output(live)}
            ended.append(out)
        self._live.clear()
        return ended

    def _configured(self, session: Any, size: int) -> None:
        if not isinstance(session, dict):
            return
        self._session, self._session_size = session, size
        model = session.get("model")
        if isinstance(model, str) and model:
            self.model = model
        audio = session.get("audio")
        if isinstance(audio, dict):  # GA: {"input": {"format": {"type": "audio/pcm"}}, ...}
            self._in_rate = _rate(audio.get("input"), self._in_rate)
            self._out_rate = _rate(audio.get("output"), self._out_rate)
        for key, rate in (("input_audio_format", "_in_rate"), ("output_audio_format", "_out_rate")):
            if isinstance(session.get(key), str):  # beta: "pcm16", "g711_ulaw", ...
                setattr(self, rate, _BYTES_PER_SECOND.get(session[key]))

    def _add_item(self, item: Any, size: int) -> None:
        if not isinstance(item, dict):
            return
        if len(self._items) >= MAX_ITEMS:
            self._items_size -= self._sizes.popleft()
            self._items.pop(0)
            self._items_dropped += 1
        self._items.append(item)
        self._sizes.append(size)
        self._items_size += size

    def _ask(self, create: Json | None, now: float, size: int) -> _Asked:
        """What the next response answers: `create` and what came before it."""
        asked = _Asked(
            create,
            now,
            self._items,
            self._items_dropped,
            self._audio,
            size + self._items_size + self._session_size,
        )
        self._items, self._items_size, self._items_dropped = [], 0, 0
        self._sizes.clear()
        self._audio = Audio()
        return asked

    def _created(self, response: Any, now: float) -> None:
        if not isinstance(response, dict) or not isinstance(response.get("id"), str):
            return
        asked = self._asked.popleft() if self._asked else self._ask(None, now, 0)
        out = WsResponse(None, asked.asked_at, model=self.model, response_id=response["id"])
        out.created_at, out.status, out.response, out.events = now, 200, response, 1
        self._live[response["id"]] = _Live(asked, out)

    def _event(self, live: _Live, kind: Any, event: Json, now: float) -> None:
        live.out.events += 1
        if kind in _FIRST_OUTPUT and live.out.first_delta_at is None:
            live.out.first_delta_at = now
        delta = event.get("delta")
        if kind in _AUDIO_OUT and isinstance(delta, str):
            place = (str(event.get("item_id")), _int(event.get("content_index")))
            audio = live.audio.setdefault(place, Audio())
            audio.add(delta, self._store_audio and not self._budget.cut)
        elif kind in _STRING_OF and isinstance(delta, str) and self._budget.spend(len(delta)):
            key = (str(event.get("item_id")), _int(event.get("content_index")), _STRING_OF[kind])
            live.strings.setdefault(key, []).append(delta)
        elif kind == "response.output_item.added" and isinstance(event.get("item"), dict):
            live.items[str(event["item"].get("id"))] = event["item"]

    def _done(self, response: Any, now: float, size: int) -> list[WsResponse]:
        if not isinstance(response, dict):
            return []
        id_ = response.get("id")
        live = self._live.pop(id_, None) if isinstance(id_, str) else None
        if live is None:  # its response.created never came
            self._created(response, now)
            live = self._live.pop(response.get("id") or "", None)
            if live is None:
                return []
        out = live.out
        out.events += 1
        out.ended_at = now
        out.response = response
        out.usage = response.get("usage") if isinstance(response.get("usage"), dict) else None
        if response.get("status") == "failed":
            out.outcome = "stream_error"
            out.error = _status_error(response)
        out.request = self._request(live)
        if out.request is None or not self._budget.spend(size):
            out.response = without_output(response)
            out.cut = True
        else:
            self._audio_out(live, response)
        return [out]

    def _refused(self, event: Json, now: float) -> list[WsResponse]:
        """An `error` event: a response of its own when it names a `response.create` waiting."""
        error = event.get("error")
        event_id = error.get("event_id") if isinstance(error, dict) else None
        for asked in self._asked:
            create = asked.create or {}
            if event_id is not None and create.get("event_id") == event_id:
                self._asked.remove(asked)
                out = WsResponse(None, asked.asked_at, model=self.model)
                out.created_at = out.ended_at = now
                out.outcome = "upstream_error"
                out.error = message(error)
                out.response = {"error": error}
                out.request = self._request(_Live(asked, out))
                return [out]
        return []

    def _request(self, live: _Live) -> Json | None:
        """The recorded request of a response; None once the session's record is cut."""
        asked = live.asked
        if not self._budget.spend(asked.size):
            live.out.cut = True
            live.out.notes.append(self._budget.note())
            return None
        request: Json = {}
        if asked.create is not None:
            request["event"] = asked.create
        if self._session is not None:
            request["session"] = self._session
        request["items"] = asked.items
        if asked.items_dropped:
            request["items_dropped"] = asked.items_dropped
        request["input_audio"] = asked.audio.record(self._in_rate)
        if self.model is not None:
            request["model"] = self.model
        return request

    def _audio_out(self, live: _Live, response: Json) -> None:
        """Count the output audio in the response; its bytes go into the part they streamed
        into, when kept."""
        if not live.audio:
            return
        total = Audio()
        for item in response.get("output") or ():
            if not isinstance(item, dict):
                continue
            for index, part in enumerate(item.get("content") or ()):
                audio = live.audio.pop((str(item.get("id")), index), None)
                if audio is None or not isinstance(part, dict):
                    continue
                total.size += audio.size
                if audio.kept is not None:
                    part["audio"] = audio.record(None)["audio"]
        total.size += sum(audio.size for audio in live.audio.values())
        response["output_audio"] = total.record(self._out_rate)


def _rate(direction: Any, default: int | None) -> int | None:
    if not isinstance(direction, dict) or not isinstance(direction.get("format"), dict):
        return default
    form = direction["format"]
    kind = form.get("type")
    if kind == "audio/pcm":
        rate = form.get("rate")
        return 2 * rate if isinstance(rate, int) and rate > 0 else 2 * _PCM16_RATE
    return _BYTES_PER_SECOND.get(kind) if isinstance(kind, str) else default


def _int(value: Any) -> int:
    return value if isinstance(value, int) else 0


def _status_error(response: Json) -> str:
    details = response.get("status_details")
    error = details.get("error") if isinstance(details, dict) else None
    return message(error) if error else "response failed"


def _partial_output(live: _Live) -> list[Json]:
    """The output of a response left half way: its items, with what streamed into them."""
    items: dict[str, Json] = {id_: dict(item) for id_, item in live.items.items()}
    for (item_id, index, key), pieces in live.strings.items():
        text = "".join(pieces)
        if key == "arguments":
            items.setdefault(item_id, {"id": item_id, "type": "function_call"})[key] = text
            continue
        item = items.setdefault(item_id, {"id": item_id, "type": "message", "role": "assistant"})
        content = item["content"] = list(item.get("content") or ())
        while len(content) <= index:
            content.append({"type": "output_text" if key == "text" else "output_audio"})
        content[index] = {**content[index], key: text}
    return list(items.values())
