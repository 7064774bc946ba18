"""Relaying the upstream's answer to the client: headers first, then the body piece by piece
through the tee, then the end of the body as it ended upstream.

Each piece is written to the client before the record looks at it (`StreamTee.relay`); how the
body ended (whole, cut, gone silent, the client gone) is the exchange's outcome.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web

from proxy.config import Config
from proxy.exchange import Exchange
from proxy.relay.appkeys import APP_CONFIG, APP_DEFERRED, APP_DEFERRED_READS, APP_SINKS
from proxy.relay.batchfile import result_lines
from proxy.relay.deferred import Deferred
from proxy.relay.headers import response_headers
from proxy.relay.record import Record
from proxy.relay.tee import StreamTee
from proxy.stream.endpoints import Endpoint
from proxy.stream.reader import BodySettings, LineReader

log = logging.getLogger(__name__)


class _Response(web.StreamResponse):
    """A response whose headers may wait for the first piece of its body and leave with it, as
    aiohttp's own `web.Response` does: one write and one packet instead of two, so the client
    has its first byte sooner and wakes once.

    A non-streamed answer's headers always wait (for its first piece, or its end). A stream's
    wait only when its first event came with the upstream's headers and so is in hand;
    otherwise they leave at once, as they left the upstream: a client may be waiting on them
    before the first event."""

    def __init__(self, *, status: int, reason: str | None, hold_headers: bool) -> None:
        super().__init__(status=status, reason=reason)
        self._send_headers_immediately = not hold_headers


async def relay(
    request: web.Request,
    app: web.Application,
    config: Config,
    answer: aiohttp.ClientResponse,
    record: Record,
    endpoint: Endpoint,
    injected: bool,
    started: float,
) -> web.StreamResponse:
    """Relay the upstream's `answer` (its headers are in) to the client, and end the response
    as the upstream's body ended."""
    content_type = answer.headers.get("Content-Type", "")
    record.answered((time.perf_counter() - started) * 1000, answer, content_type)
    is_sse = content_type.startswith("text/event-stream")
    encoding = answer.headers.get("Content-Encoding", "identity").lower()
    # Withholding an event means cutting bytes out of the body, which only works uncompressed.
    withhold = injected and is_sse and encoding in ("", "identity")
    response = _Response(
        status=answer.status,
        reason=answer.reason,
        hold_headers=not is_sse or answer.content.total_bytes > 0,
    )
    response.headers.extend(response_headers(answer.headers, withhold))
    response.headers["X-Flightrec-Id"] = record.id
    await response.prepare(request)
    settings = BodySettings(
        endpoint,
        encoding,
        sse=is_sse,
        injected=injected and is_sse,  # an upstream may take the option and answer no stream
        withhold=withhold,
        started=started,
        max_record_bytes=config.max_record_bytes,
        max_stream_record_bytes=config.max_stream_record_bytes,
        keep_raw=config.store_raw_stream,
        lines=None if request.method != "GET" else _result_lines(request, app, answer.status),
    )
    tee = record.tee = StreamTee(
        record.ensure_exchange, response.write, settings, later=app[APP_DEFERRED_READS]
    )
    try:
        await _pump(answer, tee, config.cancel_on_disconnect, app[APP_DEFERRED])
        await _end(request, response, record)
    except Exception as exc:  # the response has started: a second one cannot be sent
        exchange = record.ensure_exchange()
        log.exception("exchange %s failed while relaying", exchange.id)
        exchange.report("proxy_error", f"{type(exc).__name__}: {exc}")
        response.force_close()
    return response


def _result_lines(
    request: web.Request, app: web.Application, status: int
) -> Callable[[Exchange], LineReader] | None:
    """What reads a Batch API file's lines as its download (a GET) passes; None otherwise."""
    max_line_bytes = app[APP_CONFIG].max_record_bytes
    return result_lines(
        "GET", request.path, status, request.headers, app[APP_SINKS], max_line_bytes
    )


async def _pump(
    answer: aiohttp.ClientResponse, tee: StreamTee, cancel_on_disconnect: bool, later: Deferred
) -> None:
    """Copy the upstream body to the client through the tee as it arrives; the outcome says
    how the body ended when it did not end normally."""
    here = True
    whole = False
    first = True
    content = answer.content
    try:
        async for piece in content.iter_any():
            last = content.at_eof()
            here = await tee.relay(piece, last=last)
            if first:  # earlier exchanges' deferred work may go now (`Deferred`)
                first = False
                if later.first_piece_sent() and last:
                    # What that work left for the end of the loop's turn (the journal's line)
                    # runs before this response ends: after its end it would meet the
                    # client's next request on its way to the first byte.
                    await asyncio.sleep(0)
            if not here and cancel_on_disconnect:
                tee.exchange.report(
                    "client_disconnected", "client disconnected; upstream request cancelled"
                )
                answer.close()
                break
        whole = here  # the body ended, and the client was there for all of it
    except TimeoutError:
        tee.exchange.report("timeout", "upstream went silent mid-body (read_timeout)")
    except aiohttp.ClientPayloadError as exc:
        tee.exchange.report("upstream_disconnected", f"upstream body broken: {exc}")
    except aiohttp.ClientConnectionError as exc:
        tee.exchange.report("upstream_disconnected", f"upstream connection lost: {exc}")
    finally:
        await tee.end(whole=whole)


async def _end(request: web.Request, response: web.StreamResponse, record: Record) -> None:
    """End the response as the upstream's body ended."""
    exchange = record.ensure_exchange()
    if exchange.outcome in ("upstream_disconnected", "timeout"):
        # A cut body must look cut to the client too: the connection closes without
        # the body's end (aiohttp would write it once the handler returns).
        response.force_close()
        if request.transport is not None:
            request.transport.close()
    elif exchange.outcome != "client_disconnected":
        try:
            await response.write_eof()
        except ConnectionResetError:
            exchange.report("client_disconnected", "client disconnected before the end of the body")
