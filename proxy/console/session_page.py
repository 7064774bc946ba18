"""A session as one thread (`/sessions/{id}`) and as JSON (`GET /api/sessions/{id}`).

Each turn shows what was new in its request (the messages after the last answer it sends
back: a chat resends the whole conversation each turn) and its answer, with its model, cost
and latency; the session's totals head the page.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from proxy.console import api, views
from proxy.console.pages import render
from proxy.console.state import state
from proxy.store.read import get_exchange
from proxy.store.sessions import get_session

SHOWN_TURNS = 200
"""Turns drawn on the page; the API lists every exchange."""


def new_messages(request: Any) -> list[dict[str, Any]]:
    """The request's messages after the last assistant message it resends: the turn's own."""
    found = views.conversation(request)
    last = max((i for i, m in enumerate(found) if m["role"] == "assistant"), default=-1)
    return found[last + 1 :]


async def turns(request: web.Request, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    engine = state(request).db()
    out = []
    for at, item in enumerate(items[:SHOWN_TURNS]):
        shown = await get_exchange(engine, item["id"])
        asked = new_messages(shown["request"])
        answered = views.answers(shown["response"])
        for side, found in (("request", asked), ("answer", answered)):
            for n, message in enumerate(found):
                views.cut(message, f"/exchanges/{item['id']}/text/{side}/{n}")
        out.append({"n": at + 1, "item": item, "asked": asked, "answered": answered})
    return out


async def session_api(request: web.Request) -> web.Response:
    return api.json_response(await get_session(state(request).db(), request.match_info["id"]))


async def session_view(request: web.Request) -> web.Response:
    found = await get_session(state(request).db(), request.match_info["id"])
    items = found["exchanges"]
    return render(
        request,
        "session.html",
        s=found,
        turns=await turns(request, items),
        hidden=max(0, len(items) - SHOWN_TURNS),
        models=sorted({i["response_model"] or i["model"] or "-" for i in items}),
    )


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/sessions/{id}", session_api)
    app.router.add_get("/sessions/{id}", session_view)
