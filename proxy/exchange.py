"""The exchange: one request through the proxy and everything that happened to it.

An `Exchange` is created when a request arrives (`forward.py`), filled in as the response
streams through, and handed whole to the sinks at the end (`sinks/fanout.py`), whatever the outcome.
The store writes it to rows and reads rows back into the same shape for `logs`, `show` and
`replay`.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from proxy.usage import Usage

Outcome = Literal[
    "ok",
    "upstream_error",
    "client_disconnected",
    "upstream_disconnected",
    "stream_error",
    "timeout",
    "proxy_error",
]
UsageSource = Literal["reported", "injected", "missing"]

OUTCOME_PRECEDENCE: tuple[Outcome, ...] = (
    "proxy_error",
    "stream_error",
    "timeout",
    "upstream_disconnected",
    "client_disconnected",
    "upstream_error",
    "ok",
)
"""When more than one thing went wrong, the exchange's outcome is the first of them here: the
proxy's own failure or refusal says most; then what the stream said, then how the upstream's
body ended; a client that left counts after those (a cut upstream body is the cause when both
happen); an HTTP error status only when nothing else happened."""
_RANK = {outcome: rank for rank, outcome in enumerate(OUTCOME_PRECEDENCE)}

_uuid7_last = 0


def new_id() -> str:
    """A UUIDv7 string: time-ordered to the millisecond, strictly increasing in this process.

    Within one millisecond the 12-bit `rand_a` field counts up (RFC 9562, method 1), so ids
    minted by one process sort in minting order; 62 random bits keep processes apart. Ids are
    minted on the event loop's thread only, so no lock. Formatted directly, without building a
    `uuid.UUID`: an id is minted per request.
    """
    return format_id(id_place())


def id_place() -> int:
    """The next id's place in the order (its millisecond and sequence): take it when the
    order is decided, and `format_id` it when the string is needed."""
    global _uuid7_last
    candidate = time.time_ns() // 1_000_000 << 12
    _uuid7_last = candidate if candidate > _uuid7_last else _uuid7_last + 1
    return _uuid7_last


def format_id(ms_and_seq: int) -> str:
    """The UUIDv7 string of an `id_place`."""
    rand = _random_bits(62)
    value = (ms_and_seq >> 12) << 80 | 0x7 << 76 | (ms_and_seq & 0xFFF) << 64 | 0b10 << 62 | rand
    h = value.to_bytes(16, "big").hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# Seeded from os.urandom; uniqueness needs randomness, not secrecy (ids are not secrets).
_random_bits = random.Random().getrandbits


@dataclass(slots=True)
class Exchange:
    """Everything recorded about one request/response pair (SPEC section 4)."""

    id: str
    started_at: float
    """Unix time (seconds) at which the request reached the proxy."""
    method: str
    path: str
    """The path the client asked for, without the query string."""
    query: str
    upstream: str
    """The configured upstream's name (never a client-chosen host)."""
    upstream_url: str = ""
    status: int | None = None
    """HTTP status the client got (from the upstream, or the proxy's own 4xx/5xx)."""
    stream: bool = False
    model: str | None = None
    """The model the client requested (request body `model`)."""
    request_body: bytes | None = None
    """The request body exactly as the client sent it; None when omitted."""
    request_json: Any = None
    """`request_body` parsed, when it is JSON; whether it is stored is `omit_request`'s say.
    The store keeps the body's own text as the JSON, so the two must always agree."""
    response_body: bytes | None = None
    """The non-streamed response body, decompressed; None for streams and when not captured."""
    response_json: Any = None
    """The response as JSON: `response_body` parsed for non-streams (the two must agree, as
    for the request), the reassembled object for streams."""
    response_bytes: int = 0
    """Bytes of body the client received (after withholding an injected usage event)."""
    content_type: str | None = None
    outcome: Outcome = "ok"
    error: str | None = None
    ttfb_ms: float | None = None
    """Time from request arrival to the upstream's response headers."""
    ttft_ms: float | None = None
    """Time from request arrival to the first generated token of any kind reaching the proxy
    (streams only): output text, refusal, tool-call name or arguments, audio, or reasoning
    (summary or reasoning text, chat `reasoning_content`), whichever comes first."""
    duration_ms: float | None = None
    chunks: int = 0
    """SSE data events received from the upstream (including `[DONE]`)."""
    upstream_request_id: str | None = None
    key_hash: str | None = None
    key_hint: str | None = None
    user: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    replay_of: str | None = None
    session: str | None = None
    """The session the exchange belongs to (SPEC sections 8 and 11): every response of one
    WebSocket connection shares its id, as do the exchanges a client groups with
    `X-Flightrec-Session`, a Responses `previous_response_id` chain, or a continued chat."""
    usage: dict[str, Any] | None = None
    usage_source: UsageSource | None = None
    """Where `usage` came from; None for endpoints that never report usage."""
    response_model: str | None = None
    """The model the upstream says answered (response `model`)."""
    system_fingerprint: str | None = None
    parse_errors: list[str] = field(default_factory=list)
    """Problems met while reading the response (bad JSON in a data line, undecodable body);
    the client is never affected by them."""
    omit_request: bool = False
    omit_response: bool = False
    traceparent: str | None = None
    """The client's W3C `traceparent` header: the exchange's span is a child of it."""
    raw_stream_gz: bytes | None = None
    """For streams: the exact bytes the client received, gzip-compressed (one member), kept
    for byte-exact playback (`store_raw_stream`); a long stream's are compressed as they come,
    so it is not held in memory byte for byte (`rawcopy.py`)."""
    raw_pacing: list[tuple[int, float]] | None = None
    """For streams: (offset in the raw stream, ms since the request arrived) after each write
    to the client, so playback can reproduce the recorded timing."""
    redacted: dict[str, Any] | None = None
    """Set when `[[redact]]` rules matched (`keep.py`): `{"rules": [names], "dropped":
    ["raw_stream", "logprobs"]}`, what was not kept because a match could not be redacted
    in it faithfully."""
    tokens: Usage | None = None
    """The usage decoded once, when the exchange completed (`proxy.usage`); what rows,
    metrics, traces and the console read. None: no usage, or one of no known shape."""
    service_tier: str | None = None
    """The `service_tier` the response reports (`default`, `flex`, `priority`, ...)."""
    batch: bool = False
    """A Batch API result: priced at batch rates."""
    cost_usd: float | None = None
    """Priced once, when the exchange completed; None: unpriced (never a silent 0)."""
    price_entry: str | None = None
    """Where `cost_usd`'s price came from, e.g. `genai-prices 0.2.3 openai/gpt-5 flex`."""
    batch_line: dict[str, Any] | None = None
    """Set on an exchange made from a Batch API result line (`stream/batchfile.py`):
    `{"line_id", "file_id", "custom_id", "booked_at"}`, the key the writer books it by, once
    however often its file is downloaded."""

    def report(self, outcome: Outcome, error: str | None = None) -> None:
        """Say what happened to the exchange: the one place its `outcome` is decided.

        `outcome` (with `error`) replaces the current one unless that comes earlier in
        `OUTCOME_PRECEDENCE`. Reporting `ok` withdraws only a `client_disconnected`: the client
        left after it had the whole answer, so nothing was lost.
        """
        current = self.outcome
        if outcome == "ok":
            if current == "client_disconnected":
                self.outcome, self.error = "ok", None
        elif _RANK[outcome] <= _RANK[current]:
            self.outcome, self.error = outcome, error

    @property
    def model_name(self) -> str | None:
        """The one name every output gives the exchange's model: the answering model, else
        the requested one."""
        return self.response_model or self.model

    @classmethod
    def start(
        cls,
        method: str,
        path: str,
        query: str,
        upstream: str,
        *,
        replay_of: str | None = None,
        exchange_id: str | None = None,
        started_at: float | None = None,
    ) -> Exchange:
        """A new exchange; `exchange_id` defaults to a new id, `started_at` (Unix time) to
        now."""
        return cls(
            id=new_id() if exchange_id is None else exchange_id,
            started_at=time.time() if started_at is None else started_at,
            method=method,
            path=path,
            query=query,
            upstream=upstream,
            replay_of=replay_of,
        )
