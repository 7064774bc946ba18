"""The bare aiohttp relay: the least a correct aiohttp forwarder does, and so the floor any
aiohttp proxy (flightrec included) is measured against.

    python -m bench.relay --port P --upstream http://127.0.0.1:U/v1

Per request: read the body, send it upstream on one pooled `ClientSession` (bytes as they are:
no added headers, no decompression), copy the end-to-end headers back and stream the body
piece by piece as it arrives. Nothing is parsed, nothing recorded.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)


def end_to_end(headers: CIMultiDictProxy[str], drop: frozenset[str]) -> CIMultiDict[str]:
    return CIMultiDict(
        (name, value)
        for name, value in headers.items()
        if name.lower() not in HOP_BY_HOP and name.lower() not in drop
    )


async def relay(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    path = request.raw_path
    if not path.startswith("/v1"):
        raise web.HTTPNotFound()
    url = URL(request.app[UPSTREAM] + path[3:], encoded=True)
    headers = end_to_end(request.headers, frozenset({"host", "content-length"}))
    async with request.app[SESSION].request(
        request.method, url, headers=headers, data=body or None, allow_redirects=False
    ) as upstream:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        response.headers.extend(end_to_end(upstream.headers, frozenset()))
        await response.prepare(request)
        async for piece in upstream.content.iter_any():
            await response.write(piece)
        await response.write_eof()
        return response


async def client_session(app: web.Application) -> AsyncIterator[None]:
    app[SESSION] = aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=None, connect=10, sock_read=600),
        skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"),
        auto_decompress=False,
        connector=aiohttp.TCPConnector(limit=0),
        cookie_jar=aiohttp.DummyCookieJar(),
    )
    yield
    await app[SESSION].close()


def build_app(upstream: str) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[UPSTREAM] = upstream.rstrip("/")
    app.cleanup_ctx.append(client_session)
    app.router.add_route("*", "/{tail:.*}", relay)
    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Bare aiohttp relay (the bench's floor).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="base URL, e.g. http://h:p/v1")
    parser.add_argument("--reuse-port", action="store_true", help="share the port (SO_REUSEPORT)")
    args = parser.parse_args(argv)
    web.run_app(
        build_app(args.upstream),
        host=args.host,
        port=args.port,
        reuse_port=args.reuse_port or None,
        access_log=None,
        print=None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
