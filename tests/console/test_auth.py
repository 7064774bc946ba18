"""Console auth and hardening: with a token every route is 401 without it (JSON for the API,
the login page otherwise), Bearer and the login cookie open it, a non-loopback bind without a
token refuses to start in one line, the token is never logged, and every response carries
the security headers. Hostile recorded content is served as text."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from tests.conftest import reserved_port
from tests.console_data import BIG, Seeded, seeded_client
from tests.dbs import sqlite_url

TOKEN = "s3cret-console-token-0123456789"
Client = TestClient[Any, Any]


@pytest.fixture
async def guarded(aiohttp_client: Any, tmp_path: Path) -> AsyncIterator[tuple[Client, Seeded]]:
    url = sqlite_url(tmp_path / "console.db")
    async for pair in seeded_client(aiohttp_client, url, console_token=TOKEN):
        yield pair


def routes(s: Seeded) -> list[str]:
    one = f"/exchanges/{s.stream.id}"
    return [
        "/", one, f"/exchanges/{s.replay.id}/diff", "/cost", "/fingerprints", "/export?format=csv",
        "/nowhere", "/api/openapi.json", "/api/exchanges", f"/api{one}",
        f"/api{one}/logprobs", f"/api{one}/timeline", "/api/cost", "/api/cost/series",
        "/api/fingerprints", "/api/nowhere", "/metrics",
    ]  # fmt: skip


async def test_every_route_needs_the_token(
    guarded: tuple[Client, Seeded], caplog: pytest.LogCaptureFixture
) -> None:
    client, s = guarded
    caplog.set_level(logging.DEBUG)
    for path in routes(s):
        response = await client.get(path)
        assert response.status == 401, path
        body = await response.text()
        if path.startswith(("/api", "/metrics")):
            assert (await response.json())["error"]["type"] == "unauthorized"
        else:
            assert 'name="token"' in body and s.stream.id not in body.split("next")[0]
        wrong = await client.get(path, headers={"Authorization": "Bearer nope"})
        assert wrong.status == 401, path
    for path in routes(s):
        response = await client.get(path, headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status in (200, 404), path
    assert TOKEN not in caplog.text
    # The login page needs its stylesheet: the package's own assets hold no recorded data.
    assert (await client.get("/static/console.css")).status == 200


@pytest.fixture
async def open_console(aiohttp_client: Any, tmp_path: Path) -> AsyncIterator[tuple[Client, Seeded]]:
    async for pair in seeded_client(aiohttp_client, sqlite_url(tmp_path / "open.db")):
        yield pair


async def test_without_a_token_only_a_loopback_host_is_answered(
    open_console: tuple[Client, Seeded],
) -> None:
    """DNS rebinding: a page on evil.example whose name now resolves to 127.0.0.1 must not
    read the record through the visitor's browser."""
    client, s = open_console
    for host in ("evil.example:27401", "evil.example", "127.0.0.1.evil.example", "localhost.evil",
                 "[::1]evil", "127.0.0.1:x", "10.0.0.1:8081"):  # fmt: skip
        api = await client.get("/api/exchanges", headers={"Host": host})
        assert api.status == 403, host
        body = await api.json()
        assert body["error"]["type"] == "forbidden_host" and s.stream.id not in str(body)
        page = await client.get(f"/exchanges/{s.stream.id}", headers={"Host": host})
        assert page.status == 403 and page.content_type == "text/plain", host
        assert s.stream.id not in await page.text()
    for host in ("127.0.0.1", "127.0.0.1:27401", "LOCALHOST:8081", "localhost", "[::1]",
                 "[::1]:8081", "127.9.8.7:1"):  # fmt: skip
        api = await client.get("/api/exchanges", headers={"Host": host})
        assert api.status == 200, host
        assert s.stream.id in str(await api.json())
    assert (await client.get("/")).status == 200  # the client's own Host, 127.0.0.1:port


async def test_with_a_token_the_host_is_left_alone(guarded: tuple[Client, Seeded]) -> None:
    client, s = guarded
    headers = {"Host": "console.example:443", "Authorization": f"Bearer {TOKEN}"}
    response = await client.get("/api/exchanges", headers=headers)
    assert response.status == 200 and s.stream.id in str(await response.json())
    refused = await client.get("/api/exchanges", headers={"Host": "console.example"})
    assert refused.status == 401


async def test_login_sets_a_strict_httponly_cookie(guarded: tuple[Client, Seeded]) -> None:
    client, s = guarded
    bad = await client.post("/login", data={"token": "wrong", "next": "/cost"})
    assert bad.status == 401 and "not the token" in await bad.text()
    assert "flightrec_console" not in client.session.cookie_jar.filter_cookies(client.make_url("/"))
    good = await client.post(
        "/login", data={"token": TOKEN, "next": "//evil.example/"}, allow_redirects=False
    )
    assert good.status == 303 and good.headers["Location"] == "/"
    for target in ("https://evil.example/", "/\\evil", "/cost\r\nSet-Cookie: x=1"):
        data = {"token": TOKEN, "next": target}
        again = await client.post("/login", data=data, allow_redirects=False)
        assert again.headers["Location"] == "/", target
    cookie = good.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
    page = await client.get(f"/exchanges/{s.stream.id}")
    assert page.status == 200 and s.stream.id in await page.text()
    assert (await client.get("/api/exchanges")).status == 200
    await client.post("/logout")
    client.session.cookie_jar.clear()
    assert (await client.get("/api/exchanges")).status == 401


async def test_security_headers_on_every_response(guarded: tuple[Client, Seeded]) -> None:
    client, s = guarded
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for path in [*routes(s), "/login"]:
        for headers in ({}, auth):
            response = await client.get(path, headers=headers)
            csp = response.headers["Content-Security-Policy"]
            assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
            assert "unsafe-inline" not in csp
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            assert response.headers["Referrer-Policy"] == "no-referrer"


async def test_hostile_content_is_text(guarded: tuple[Client, Seeded]) -> None:
    client, s = guarded
    auth = {"Authorization": f"Bearer {TOKEN}"}
    pages = ["/", f"/exchanges/{s.hostile.id}", f"/exchanges?q={BIG[:10]}", "/cost?by=user"]
    for path in pages:
        html = await (await client.get(path, headers=auth)).text()
        assert "<script>window" not in html and "<img src=x" not in html
        assert 'href="javascript:' not in html and "<svg onload" not in html
        assert "49" not in html.split("{{")[0][-5:]  # no template evaluated
    html = await (await client.get(f"/exchanges/{s.hostile.id}", headers=auth)).text()
    assert "&lt;script&gt;window.pwned = 1" in html
    assert html.count("<script") == 1  # the console's own, from /static
    path = f"/exchanges/{s.big.id}/text/request/0"
    big = await (await client.get(path, headers=auth)).text()
    assert BIG in big


async def flightrec(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTREC_")}
    full_env.update(env or {})
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "proxy", *args, env=full_env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, err.decode()


async def test_non_loopback_without_a_token_refuses_in_one_line(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "c.db")
    code, err = await flightrec("console", "--host", "0.0.0.0", "--db", url)
    assert code != 0 and "Traceback" not in err
    [line] = err.strip().splitlines()
    assert "console_token" in line
    env = {"FLIGHTREC_CONSOLE_HOST": "0.0.0.0"}
    with reserved_port() as port:
        code, err = await flightrec("serve", "--db", url, "--port", str(port), env=env)
    assert code != 0 and "console_token" in err.strip()  # before it binds anything
    assert len(err.strip().splitlines()) == 1
    # the same host with FLIGHTREC_CONSOLE_TOKEN set gets past the check (and then fails on
    # the missing database file, still one line, never showing the token)
    with reserved_port() as port:
        code, err = await flightrec(
            "console", "--host", "0.0.0.0", "--port", str(port), "--db", url,
            env={"FLIGHTREC_CONSOLE_TOKEN": TOKEN},
        )  # fmt: skip
    [line] = err.strip().splitlines()
    assert "no database file" in line and TOKEN not in err
