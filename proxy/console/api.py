"""The console's JSON API (SPEC section 8): read-only, the objects the CLI prints.

Each handler parses its query with `params` (400 naming the parameter) and calls the same
store function as the CLI command it mirrors: `logs --json` (`browse.list_page`),
`show --json` (`read.get_exchange`), `cost --format json` (`report.cost_report`).
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from proxy.console import params
from proxy.console.openapi import document
from proxy.console.state import state
from proxy.store import browse, detail, overview, report, series
from proxy.store.engine import StoreError
from proxy.store.read import get_exchange


def json_response(value: Any, status: int = 200) -> web.Response:
    body = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    return web.Response(body=body, status=status, content_type="application/json")


def error(status: int, message: str, kind: str, param: str | None) -> web.Response:
    return json_response({"error": {"message": message, "type": kind, "param": param}}, status)


@web.middleware
async def api_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Bad parameters are 400 and unknown ids 404, as JSON, on API routes."""
    try:
        return await handler(request)  # type: ignore[no-any-return]
    except params.BadParam as exc:
        if not request.path.startswith("/api/"):
            raise
        return error(400, str(exc), "invalid_request_error", exc.param)
    except StoreError as exc:
        if not request.path.startswith("/api/"):
            raise
        return error(404, str(exc), "not_found", "id")


async def load_exchange(request: web.Request) -> dict[str, Any]:
    """The `show --json` object of the `{id}` in the path; StoreError (404) when unknown."""
    return await get_exchange(state(request).db(), request.match_info["id"])


async def list_exchanges(request: web.Request) -> web.Response:
    items, following, _ = await list_page(request)
    return json_response({"items": items, "next": following})


async def list_page(request: web.Request) -> tuple[list[dict[str, Any]], str | None, str | None]:
    """One page of the list for the request's query (the API's and the page's): its items,
    the cursor of the next page, and the cursor this page started at."""
    query = request.query
    params.check_known(query, params.LIST_PARAMS)
    filters = params.list_filters(query, state(request).names)
    limit, cursor = params.page(query)
    order = params.sort(query)
    try:
        items, following = await browse.list_page(
            state(request).db(), filters, limit=limit, cursor=cursor, sort=order
        )
    except ValueError as exc:  # a cursor of another order
        raise params.BadParam("cursor", str(exc)) from None
    return items, following, cursor


async def show_exchange(request: web.Request) -> web.Response:
    shown = await load_exchange(request)
    shown["replays"] = await browse.replays_of(state(request).db(), shown["id"])
    return json_response(shown)


async def exchange_logprobs(request: web.Request) -> web.Response:
    shown = await load_exchange(request)
    return json_response(await detail.logprobs(state(request).db(), shown["id"]))


async def exchange_timeline(request: web.Request) -> web.Response:
    shown = await load_exchange(request)
    return json_response(await detail.timeline(state(request).db(), shown["id"]))


async def cost(request: web.Request) -> web.Response:
    query = request.query
    params.check_known(query, params.COST_PARAMS | {"by"})
    rows = await report.cost_report(
        state(request).db(), params.by(query), params.cost_filters(query, state(request).names)
    )
    return json_response(report.as_json(rows))


async def cost_series(request: web.Request) -> web.Response:
    query = request.query
    params.check_known(query, params.COST_PARAMS | {"by", "bucket"})
    found = await series.cost_series(
        state(request).db(),
        params.by(query),
        params.bucket(query),
        params.cost_filters(query, state(request).names),
    )
    return json_response(found)


async def overview_api(request: web.Request) -> web.Response:
    """SPEC 8's `/api/overview`, for the filters of the list."""
    query = request.query
    params.check_known(query, params.OVERVIEW_PARAMS)
    console = state(request)
    found = await overview.overview(
        console.db(), params.list_filters(query, console.names), fold_later=console.fold_later
    )
    return json_response(found)


async def fingerprints(request: web.Request) -> web.Response:
    params.check_known(request.query, frozenset())
    return json_response(await browse.fingerprints(state(request).db()))


async def openapi(request: web.Request) -> web.Response:
    return json_response(document())


async def not_found(request: web.Request) -> web.Response:
    return error(404, f"no API route {request.path}", "not_found", None)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/openapi.json", openapi)
    app.router.add_get("/api/exchanges", list_exchanges)
    app.router.add_get("/api/exchanges/{id}", show_exchange)
    app.router.add_get("/api/exchanges/{id}/logprobs", exchange_logprobs)
    app.router.add_get("/api/exchanges/{id}/timeline", exchange_timeline)
    app.router.add_get("/api/cost", cost)
    app.router.add_get("/api/cost/series", cost_series)
    app.router.add_get("/api/overview", overview_api)
    app.router.add_get("/api/fingerprints", fingerprints)
    app.router.add_get("/api/{tail:.*}", not_found)
