"""Who may see the console, and the headers every console response carries.

With a `console_token`, every route but `/login` and the package's own CSS and JS needs it:
`Authorization: Bearer <token>` or the session cookie `POST /login` sets (HttpOnly,
SameSite=Strict). The cookie holds an HMAC of
the token, never the token, and every comparison is constant-time. Without a token the console
only binds to loopback (`check_bind`) and only answers requests whose `Host` is a loopback name
(`loopback_host`), so a web page whose DNS name is rebound to 127.0.0.1 cannot read it. The
token is never logged.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from proxy.config import ConfigError
from proxy.console.state import state

COOKIE = "flightrec_console"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
"""No inline script or style anywhere: recorded content can never run, even if it escaped."""
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cache-Control": "no-store",
}
PUBLIC_ASSETS = frozenset({"/static/console.css", "/static/console.js"})
"""The login page needs them; they are the package's own files, no recorded data."""
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def loopback_host(host: str | None) -> bool:
    """Whether a `Host` header names this machine: `localhost`, `127.x.y.z` or `[::1]`, any port."""
    if not host:
        return False
    host = host.strip().lower()
    if host.startswith("["):
        name, bracket, port = host[1:].partition("]")
        if not bracket or (port and not (port[:1] == ":" and port[1:].isdigit())):
            return False
        return name != "localhost" and is_loopback(name)
    name, colon, port = host.partition(":")
    if colon and not port.isdigit():
        return False
    return name == "localhost" or (name[:1].isdigit() and is_loopback(name))


def check_bind(host: str, token: str | None, where: str | None = None) -> None:
    """Refuse to serve the record to a network without a token; `where` is the flag that set
    `host`, if one did."""
    if not token and not is_loopback(host):
        raise ConfigError(
            f"{where or 'console_host'}: the console on {host} would be open to the network; set "
            "console_token (or FLIGHTREC_CONSOLE_TOKEN), or bind it to 127.0.0.1"
        )


def session_value(token: str) -> str:
    return hmac.new(token.encode(), b"flightrec console session", hashlib.sha256).hexdigest()


def _equal(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def authorized(request: web.Request, token: str) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and _equal(given.strip(), token):
        return True
    cookie = request.cookies.get(COOKIE)
    return cookie is not None and _equal(cookie, session_value(token))


def is_api(path: str) -> bool:
    return path.startswith("/api/") or path == "/api" or path == "/metrics"


def unauthorized_json() -> web.Response:
    body = {
        "error": {
            "message": "this console needs its token: Authorization: Bearer <console_token>",
            "type": "unauthorized",
            "param": None,
        }
    }
    return web.json_response(body, status=401, headers={"WWW-Authenticate": "Bearer"})


def foreign_host(request: web.Request) -> web.Response:
    message = "this console has no token, so it only answers requests for a loopback Host"
    if is_api(request.path):
        body = {"error": {"message": message, "type": "forbidden_host", "param": None}}
        return web.json_response(body, status=403)
    return web.Response(status=403, text=message + "\n")


def make_auth_middleware(
    login_page: Callable[[web.Request, int], Awaitable[web.StreamResponse]],
) -> Middleware:
    @web.middleware
    async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        token = state(request).token
        if not token:
            # Without a token, a DNS-rebound name must not reach the record through a browser.
            if not loopback_host(request.headers.get("Host")):
                return foreign_host(request)
            return await handler(request)
        if request.path == "/login" or authorized(request, token):
            return await handler(request)
        if request.path in PUBLIC_ASSETS:
            return await handler(request)
        if is_api(request.path):
            return unauthorized_json()
        return await login_page(request, 401)

    return require_token


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: every response, errors included, gets the same headers."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)


def safe_next(target: str | None) -> str:
    """Where to go after logging in: a path on this console, never another site."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in target):
        return "/"  # a control character would break the Location header
    return target


def see_other(location: str) -> web.Response:
    return web.Response(status=303, headers={"Location": location})


def login_response(request: web.Request, given: object, target: object) -> web.Response | None:
    """The redirect that logs in (setting the session cookie), or None for a wrong token."""
    token = state(request).token
    response = see_other(safe_next(target if isinstance(target, str) else None))
    if not token:
        return response
    if not isinstance(given, str) or not _equal(given, token):
        return None
    response.set_cookie(
        COOKIE,
        session_value(token),
        httponly=True,
        samesite="Strict",
        path="/",
        secure=request.secure,
    )
    return response
