"""`flightrec health`: ask a running proxy whether it is up (`/healthz`) or ready (`/readyz`).

A container's HEALTHCHECK runs this with the same config as `serve` (file, `FLIGHTREC_*`
environment, flags), so it asks the port the proxy really serves on. A wildcard listen address
is asked on loopback. Standard library only, and one line out: an engine runs it every few
seconds and keeps what it prints.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass

from proxy.config import Config

_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}
"""Where a listener bound to every address can be reached from inside its own host."""


@dataclass(frozen=True)
class Health:
    ok: bool
    line: str
    """One line for the operator: the URL asked and what it answered, or why it did not."""


def target(config: Config, *, ready: bool = False) -> tuple[str, int, str]:
    """The host, port and path to ask for `config`'s proxy."""
    host = _LOOPBACK.get(config.host, config.host)
    return host, config.port, "/readyz" if ready else "/healthz"


def check(config: Config, *, ready: bool = False, timeout: float = 5.0) -> Health:
    """Ask the proxy `config` describes; ok only for a 200."""
    host, port, path = target(config, ready=ready)
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        status, body = answer.status, answer.read(4096)
    except TimeoutError:
        return Health(False, f"unhealthy: {url}: no answer within {timeout:g}s")
    except (OSError, http.client.HTTPException) as exc:
        return Health(False, f"unhealthy: {url}: {_reason(exc)}")
    finally:
        connection.close()
    said = " ".join(_said(body).split())  # one line, whatever the body held
    if status == 200:
        return Health(True, f"ok: {url} {status} {said}".rstrip())
    return Health(False, f"unhealthy: {url} {status} {said}".rstrip())


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is flightrec serving on this port?)"
    return str(exc) or type(exc).__name__


def _said(body: bytes) -> str:
    """What the endpoint said, in a few words: its status, and its reason when not ready."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:200]
    if not isinstance(payload, dict):
        return str(payload)[:200]
    words = [str(payload.get("status", ""))]
    if payload.get("reason"):
        words.append(str(payload["reason"]))
    return ": ".join(w for w in words if w)
