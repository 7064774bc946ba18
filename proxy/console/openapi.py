"""The OpenAPI 3.1 document of the console's JSON API (`GET /api/openapi.json`)."""

from __future__ import annotations

from functools import cache
from importlib import metadata
from typing import Any

from proxy.store.browse import MAX_LIMIT, OUTCOMES

_TEXT = {"type": "string"}
_FILTERS = {
    "since": "exchanges started at or after: 15m, 2h, 7d, 1w ago, or an ISO date/time",
    "until": "exchanges started before (same forms as since)",
    "model": "the requested or the answering model, exactly",
    "key": "the API key's hint (sk-...a1b2) or its hash, or a prefix of the hash",
}
_LIST_FILTERS = {
    "user": "the end user, exactly",
    "upstream": "the upstream's configured name",
    "fingerprint": "the response's system_fingerprint",
    "replay_of": "only replays of this exchange id",
    "q": "text in the stored request (prompts) or the answer, case-insensitive for ASCII",
    "cursor": "the `next` of the previous page",
}
_BY = "model, key, user, day, upstream or tag:<key>"


def _param(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "in": "query", "description": description, "schema": schema or _TEXT}


def _tag() -> dict[str, Any]:
    return {
        **_param("tag", "k=v; repeatable, all must match", {"type": "array", "items": _TEXT}),
        "explode": True,
    }


def _cost_params() -> list[dict[str, Any]]:
    return [*(_param(k, v) for k, v in _FILTERS.items()), _tag(), _param("by", _BY)]


def _list_params() -> list[dict[str, Any]]:
    found = [_param(k, v) for k, v in _FILTERS.items()]
    found += [_param(k, v) for k, v in _LIST_FILTERS.items()]
    found += [
        _tag(),
        _param("outcome", "the exchange's outcome", {"enum": list(OUTCOMES)}),
        _param("status", "the HTTP status", {"type": "integer"}),
        _param("limit", "page size", {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}),
    ]
    return found


def _get(summary: str, params: list[dict[str, Any]], by_id: bool = False) -> dict[str, Any]:
    if by_id:
        params = [{"name": "id", "in": "path", "required": True, "schema": _TEXT}, *params]
    responses: dict[str, Any] = {
        "200": {"description": summary, "content": {"application/json": {}}},
        "400": {"$ref": "#/components/responses/Error"},
        "401": {"$ref": "#/components/responses/Error"},
        "503": {"$ref": "#/components/responses/Error"},  # the database cannot be read now
    }
    if by_id:
        responses["404"] = {"$ref": "#/components/responses/Error"}
    return {"get": {"summary": summary, "parameters": params, "responses": responses}}


@cache
def document() -> dict[str, Any]:
    error = {
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {
                    "message": _TEXT,
                    "type": _TEXT,
                    "param": {"type": ["string", "null"]},
                },
            }
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "flightrec console API", "version": metadata.version("flightrec")},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "responses": {
                "Error": {
                    "description": "an error naming the parameter",
                    "content": {"application/json": {"schema": error}},
                }
            },
        },
        "security": [{"bearer": []}, {}],
        "paths": {
            "/api/exchanges": _get(
                "{items: logs --json objects, newest first, next: cursor or null}",
                _list_params(),
            ),
            "/api/exchanges/{id}": _get("the show --json object plus replays", [], True),
            "/api/exchanges/{id}/logprobs": _get("tokens and stats per choice", [], True),
            "/api/exchanges/{id}/timeline": _get("pacing [[bytes, ms]], ttft_ms", [], True),
            "/api/cost": _get("what cost --format json prints", _cost_params()),
            "/api/cost/series": _get(
                "{bucket, series: [{group, points: [[start, cost_usd, requests, "
                "prompt_tokens, completion_tokens]]}]}",
                [*_cost_params(), _param("bucket", "hour or day", {"enum": ["hour", "day"]})],
            ),
            "/api/fingerprints": _get("the fingerprints rows", []),
        },
    }
