"""An exchange's record, from the request's arrival to the sinks.

`Record` holds what the record needs while the exchange runs and makes the `Exchange` once the
client has the first byte of the answer (or sooner, when the exchange ends sooner): filling its
forty fields on the way to the first byte would delay it. `conclude` completes the record after
the response, when the client's next request has gone on (`Deferred`), and hands it to the sinks
(which first take out what the record may not keep: `keep.py`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from aiohttp import web

from proxy.config import Upstream
from proxy.exchange import Exchange, format_id
from proxy.relay.forms import FORM_KEYS, form_fields
from proxy.relay.headers import control_headers, key_identity
from proxy.relay.paths import mask_query
from proxy.relay.usage_option import UpstreamBody, parse_json_body
from proxy.sinks.fanout import Sinks

if TYPE_CHECKING:
    from proxy.relay.tee import StreamTee

log = logging.getLogger(__name__)


class Record:
    """What the record says of one exchange, made into an `Exchange` when first asked for:
    by the tee, a moment after the first piece of the answer was written, or by whatever ends
    the exchange sooner. The id is minted when the request arrives, so ids sort as requests
    came; the decoded path and the query are filled in by `conclude`."""

    __slots__ = (
        "_answer",
        "_began",
        "_exchange",
        "_method",
        "_rest",
        "_upstream",
        "body",
        "controls",
        "id",
        "tee",
    )

    def __init__(
        self, place: int, method: str, upstream: Upstream, rest: str, began: float
    ) -> None:
        self.id = format_id(place)
        self._method = method
        self._upstream = upstream
        self._rest = rest
        self._began = began
        self._exchange: Exchange | None = None
        self._answer: tuple[float, aiohttp.ClientResponse, str] | None = None
        self.body: UpstreamBody | None = None
        """The request body, parsed when the proxy had to (else `conclude` parses it)."""
        self.tee: StreamTee | None = None
        """The answer's tee, once the answer is being relayed: `conclude` has it finish."""
        self.controls: list[tuple[str, str]] | None = None
        """The request's control headers, once the headers for the upstream were made
        (`headers.upstream_headers`); None before."""

    def answered(self, ttfb_ms: float, response: aiohttp.ClientResponse, content_type: str) -> None:
        """The upstream's answer has come: what the record says of it, filled in when the
        record is made."""
        self._answer = (ttfb_ms, response, content_type)
        if self._exchange is not None:
            self._fill_answer(self._exchange)

    def ensure_exchange(self) -> Exchange:
        exchange = self._exchange
        if exchange is None:
            upstream = self._upstream
            body = self.body
            # Positional, in `Exchange`'s field order (keywords cost a search each among its
            # fifty parameters); `tests/relay/test_record.py` holds it to the named call.
            exchange = self._exchange = Exchange(
                self.id,
                self._began,
                self._method,
                "",  # path and query: `conclude` fills them in
                "",
                upstream.name,
                upstream.base_url + self._rest.partition("?")[0],
                None,  # status
                False,  # stream
                None,  # model
                None if body is None else body.original,
                None if body is None else body.payload,
            )
            if self._answer is not None:
                self._fill_answer(exchange)
        return exchange

    def _fill_answer(self, exchange: Exchange) -> None:
        assert self._answer is not None
        ttfb_ms, response, content_type = self._answer
        exchange.ttfb_ms = ttfb_ms
        exchange.status = response.status
        exchange.upstream_request_id = response.headers.get("x-request-id")
        exchange.content_type = content_type or None
        exchange.stream = exchange.stream or content_type.startswith("text/event-stream")


def conclude(
    exchange: Exchange,
    request: web.Request,
    tee: StreamTee | None,
    sinks: Sinks,
    controls: list[tuple[str, str]] | None = None,
) -> None:
    """Complete the record and hand it to the sinks, whatever happened before. `controls`:
    the request's control headers when collected already (`Record.controls`)."""
    try:
        exchange.path = request.path
        exchange.query = mask_query(request.query_string)
        if tee is not None:
            tee.finish()
            if exchange.outcome == "ok" and (exchange.status or 0) >= 400:
                exchange.report(
                    "upstream_error", _error_text(exchange.response_json, exchange.response_body)
                )
        _describe_request(exchange, request.headers, controls)
    except Exception as exc:  # a bug here must not cost the record
        log.exception("exchange %s: completing the record failed", exchange.id)
        if exchange.outcome == "ok":
            exchange.report(
                "proxy_error", f"completing the record failed: {type(exc).__name__}: {exc}"
            )
    finally:
        sinks.accept(exchange)


def _describe_request(
    exchange: Exchange, headers: Any, found: list[tuple[str, str]] | None
) -> None:
    """What the record says about the request besides its bytes: the control headers, the
    key, the model, the user."""
    controls_user = None
    if found is None or found:
        controls = control_headers(headers, found)
        exchange.tags = controls.tags
        exchange.omit_request = controls.omit_request
        exchange.omit_response = controls.omit_response
        exchange.replay_of = controls.replay_of
        exchange.session = controls.session
        controls_user = exchange.user = controls.user
    else:  # no control headers (nearly every request): their defaults, `Controls` unmade
        exchange.tags = {}
        exchange.omit_request = exchange.omit_response = False
        exchange.replay_of = exchange.session = exchange.user = None
    exchange.traceparent = headers.get("traceparent")
    exchange.key_hash, exchange.key_hint = key_identity(headers)
    payload = exchange.request_json
    if payload is None and exchange.request_body:
        payload = exchange.request_json = parse_json_body(exchange.request_body)
    if payload is None and exchange.request_body:  # an upload names its model in a form field
        payload = form_fields(exchange.request_body, headers.get("Content-Type", ""), FORM_KEYS)
    if isinstance(payload, dict):
        model = payload.get("model")
        exchange.model = model if isinstance(model, str) else None
        exchange.stream = exchange.stream or payload.get("stream") in (True, "true")
        named = payload.get("user") or payload.get("safety_identifier")
        exchange.user = controls_user or (named if isinstance(named, str) else None)


def _error_text(response_json: Any, response_body: bytes | None) -> str | None:
    if isinstance(response_json, dict):
        error = response_json.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if error is not None:
            return orjson.dumps(error).decode()
    if response_body:
        return response_body[:1000].decode("utf-8", "replace")
    return None
