"""The console's HTML pages, rendered on the server: they read fine with JavaScript off.

Each page calls the same store functions as the API (and the CLI); `views` and `charts`
shape the results for the templates. A filter is a GET form, so a view is a URL to share.
"""

from __future__ import annotations

import tempfile
from collections.abc import Awaitable, Callable
from datetime import datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from proxy.console import api, auth, charts, cost_chart, exchange_parts, listing, params, views
from proxy.console.state import state
from proxy.privacy.keep import redactor_for
from proxy.store import browse, detail, overview, report, series, sessions
from proxy.store.engine import StoreError
from proxy.store.filters import Filters
from proxy.store.read import get_exchange
from proxy.tools import export as export_mod
from proxy.tools.compare import compare, content_of

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LIST = "/exchanges"
GROUPS = ("model", "key", "user", "upstream", "day")
"""The cost page's `By` choices, before the tag keys the record has."""
EXPORT_TYPES = {"jsonl": "application/x-ndjson", "csv": "text/csv", "har": "application/json"}


def when(iso: str | None) -> str:
    return "-" if iso is None else datetime.fromisoformat(iso).strftime("%Y-%m-%d %H:%M:%S")


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def usd(value: Any) -> str:
    return "unpriced" if value is None else "$" + report.usd(Decimal(str(value)))


def render(request: web.Request, name: str, status: int = 200, **context: Any) -> web.Response:
    env = state(request).templates
    context.setdefault("signed_in", bool(state(request).token))
    context.setdefault("path", request.path)
    html = env.get_template(name).render(**context)
    return web.Response(text=html, status=status, content_type="text/html", charset="utf-8")


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Pages answer a bad parameter, an unknown id or route with a page saying so."""
    if request.path.startswith("/api/"):
        return await handler(request)
    try:
        return await handler(request)
    except params.BadParam as exc:
        return render(request, "error.html", 400, title="Bad parameter", message=str(exc))
    except StoreError as exc:
        return render(request, "error.html", 404, title="Not found", message=str(exc))
    except web.HTTPNotFound:
        message = f"no page at {request.path}"
        return render(request, "error.html", 404, title="Not found", message=message)


def _url(path: str, pairs: list[tuple[str, Any]]) -> str:
    return path + ("?" + urlencode(pairs) if pairs else "")


async def list_view(request: web.Request) -> web.Response:
    query = request.query
    items, following, cursor = await api.list_page(request)
    kept = params.plain(query, params.LIST_PARAMS - {"cursor"})
    filter_pairs = [(k, v) for k, v in kept if k not in ("limit", "sort")]
    engine = state(request).db()
    await listing.decorate(engine, items, state(request).names)
    return render(
        request,
        "list.html",
        items=items,
        form={k: query.get(k, "") for k in params.LIST_PARAMS},
        tags=[v for v in query.getall("tag", []) if v.strip()] or [""],
        outcomes=browse.OUTCOMES,
        models=[v for v, _ in await overview.choices(engine, "model_any")],
        next_url=None if following is None else _url(LIST, [*kept, ("cursor", following)]),
        first_url=_url(LIST, kept) if cursor else None,
        exports={f: _url("/export", [*filter_pairs, ("format", f)]) for f in EXPORT_TYPES},
        filtered=bool(filter_pairs),
        summary=await listing.summary(
            engine, params.list_filters(query, state(request).names), state(request).fold_later
        ),
        sorts=listing.sort_links(kept, params.sort(query)),
        api_url=_url("/api/exchanges", [(k, v) for k, v in kept if k != "sort"]),
        live=not cursor and params.sort(query) == "newest",
    )


def _parts(shown: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    return {
        "request": views.conversation(shown["request"]),
        "answer": views.answers(shown["response"]),
    }


async def exchange_view(request: web.Request) -> web.Response:
    engine = state(request).db()
    shown = await get_exchange(engine, request.match_info["id"])
    probs = await detail.logprobs(engine, shown["id"])
    parts = _parts(shown)
    for side, found in parts.items():
        for at, message in enumerate(found):
            views.cut(message, f"/exchanges/{shown['id']}/text/{side}/{at}")
    return render(
        request,
        "exchange.html",
        ex=shown,
        replays=await browse.replays_of(engine, shown["id"]),
        messages=parts["request"],
        upload=isinstance(shown["request"], str) or views.is_binary(shown["request"]),
        answers=parts["answer"],
        logprobs=views.logprob_view(probs["choices"]),
        timeline=views.timeline(await detail.timeline(engine, shown["id"])),
        session=await sessions.session_of(engine, shown),
        key_name=state(request).names.name(shown["key_hash"], shown["key_hint"]),
        parameters=exchange_parts.parameters(shown["request"], shown["response"]),
        counts=exchange_parts.tokens(shown["tokens"]),
        curl=exchange_parts.curl(shown),
        raw_request=exchange_parts.raw(shown["request"]),
        raw_response=exchange_parts.raw(shown["response"]),
    )


async def text_view(request: web.Request) -> web.Response:
    """One message of an exchange in full, where the exchange page shows its beginning."""
    shown = await get_exchange(state(request).db(), request.match_info["id"])
    found = _parts(shown).get(request.match_info["side"], [])
    at = request.match_info["at"]
    if not at.isdigit() or int(at) >= len(found):
        raise StoreError(f"exchange {shown['id']} has no such message")
    return render(request, "text.html", ex=shown, m=found[int(at)])


async def diff_view(request: web.Request) -> web.Response:
    engine = state(request).db()
    replayed = await get_exchange(engine, request.match_info["id"])
    if replayed["replay_of"] is None:
        raise StoreError(f"exchange {replayed['id']} is not a replay")
    original = await get_exchange(engine, replayed["replay_of"])
    old_text = content_of(original["response"])
    new_text = content_of(replayed["response"])
    left, right = views.word_diff(old_text, new_text)
    return render(
        request,
        "diff.html",
        original=original,
        replay=replayed,
        c=compare(original, replayed),
        left=left,
        right=right,
        old_answers=views.answers(original["response"]),
        new_answers=views.answers(replayed["response"]),
    )


async def cost_view(request: web.Request) -> web.Response:
    query = request.query
    params.check_known(query, params.COST_PARAMS | {"by", "bucket"})
    filters = params.cost_filters(query, state(request).names)
    by, bucket = params.by(query), params.bucket(query)
    engine = state(request).db()
    rows = await report.cost_report(engine, by, filters)
    found = await series.cost_series(engine, by, bucket, filters)
    kept = params.plain(query, params.COST_PARAMS)
    tag_keys = sorted(
        {value.split("=", 1)[0] for value, _ in await overview.choices(engine, "tag")}
    )
    groups = [*GROUPS, *(f"tag:{key}" for key in tag_keys)]
    return render(
        request,
        "cost.html",
        rows=rows,
        total=report.total(rows),
        by=by,
        bucket=bucket,
        form={k: query.get(k, "") for k in params.COST_PARAMS},
        tags=[v for v in query.getall("tag", []) if v.strip()] or [""],
        charts=await cost_chart.charts(engine, found, filters, bucket),
        groups=groups,
        api_url=_url("/api/cost", [*kept, ("by", by)]),
    )


async def fingerprints_view(request: web.Request) -> web.Response:
    rows = await browse.fingerprints(state(request).db())
    return render(request, "fingerprints.html", lanes=charts.fingerprint_lanes(rows))


async def export_view(request: web.Request) -> web.StreamResponse:
    """The list's current filter as CSV, JSONL or HAR (`flightrec export`'s writers)."""
    query = request.query
    params.check_known(query, (params.LIST_PARAMS - {"cursor", "limit", "sort"}) | {"format"})
    fmt = query.get("format", "")
    if fmt not in EXPORT_TYPES:
        raise params.BadParam("format", f"expected one of {', '.join(EXPORT_TYPES)}")
    filters = Filters(also=tuple(params.list_filters(query, state(request).names).where()))
    response = web.StreamResponse(
        headers={
            "Content-Type": EXPORT_TYPES[fmt],
            "Content-Disposition": f'attachment; filename="flightrec.{fmt}"',
        }
    )
    with tempfile.SpooledTemporaryFile(max_size=8 << 20) as buffer:
        config = state(request).config
        # The configured rules, as `flightrec export` applies them: old records come out clean.
        redactor = redactor_for(config)
        await export_mod.export(
            state(request).db(),
            buffer.write,
            fmt,
            filters,
            upstreams=config.upstreams,
            redactor=redactor,
        )
        buffer.seek(0)
        await response.prepare(request)
        while chunk := buffer.read(1 << 16):
            await response.write(chunk)
    await response.write_eof()
    return response


async def login_page(request: web.Request, status: int = 200) -> web.Response:
    target = request.query.get("next") or request.path_qs
    return render(
        request,
        "login.html",
        status,
        next=auth.safe_next(target if target != "/login" else "/"),
        failed=False,
        signed_in=False,
    )


async def login_get(request: web.Request) -> web.Response:
    return await login_page(request)


async def login_post(request: web.Request) -> web.Response:
    form = await request.post()
    response = auth.login_response(request, form.get("token"), form.get("next"))
    if response is not None:
        return response
    nxt = auth.safe_next(str(form.get("next") or "/"))
    return render(request, "login.html", 401, next=nxt, failed=True, signed_in=False)


async def logout(request: web.Request) -> web.Response:
    response = auth.see_other("/login")
    response.del_cookie(auth.COOKIE, path="/")
    return response


def add_routes(app: web.Application) -> None:
    app.router.add_get(LIST, list_view)
    app.router.add_get("/exchanges/{id}", exchange_view)
    app.router.add_get("/exchanges/{id}/diff", diff_view)
    app.router.add_get("/exchanges/{id}/text/{side}/{at}", text_view)
    app.router.add_get("/cost", cost_view)
    app.router.add_get("/fingerprints", fingerprints_view)
    app.router.add_get("/export", export_view)
    app.router.add_get("/login", login_get)
    app.router.add_post("/login", login_post)
    app.router.add_post("/logout", logout)
