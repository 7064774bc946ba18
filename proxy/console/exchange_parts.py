"""More of the exchange page: the request's parameters, its raw JSON inline, a curl command
that sends it again (the key left as a placeholder), and the token counts an endpoint has.
Text only: the templates escape all of it."""

from __future__ import annotations

import shlex
from typing import Any

from proxy.console.views import pretty_json

RAW_CHARS = 20_000
"""Raw JSON shown inline at most (and the largest body a curl command is made of); the API
has all of it."""
PARAMS = (
    "temperature", "top_p", "max_tokens", "max_completion_tokens", "max_output_tokens", "n",
    "seed", "stop", "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs",
    "stream", "parallel_tool_calls", "tool_choice", "dimensions", "encoding_format",
    "voice", "language", "size", "quality", "truncation", "store",
)  # fmt: skip


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else pretty_json(value).replace("\n", " ")
    return text if len(text) <= 200 else text[:200] + "…"


def parameters(request: Any, response: Any) -> list[tuple[str, str]]:
    """(name, value) of each parameter the request set, and the service tier it got."""
    if not isinstance(request, dict):
        return []
    found = [(name, _short(request[name])) for name in PARAMS if name in request]
    tools = request.get("tools")
    if isinstance(tools, list) and tools:
        names = [_tool_name(tool) for tool in tools]
        found.append(("tools offered", ", ".join(names)))
    fmt = request.get("response_format") or (request.get("text") or {}).get("format")
    if isinstance(fmt, dict):
        schema = fmt.get("json_schema") if isinstance(fmt.get("json_schema"), dict) else fmt
        named = schema.get("name") if isinstance(schema, dict) else None
        found.append(("response_format", f"{fmt.get('type')}{f' ({named})' if named else ''}"))
    reasoning = request.get("reasoning_effort") or (request.get("reasoning") or {}).get("effort")
    if reasoning:
        found.append(("reasoning effort", str(reasoning)))
    served = response.get("service_tier") if isinstance(response, dict) else None
    asked = request.get("service_tier")
    if asked or served:
        found.append(("service_tier", f"asked {asked or '(default)'}, served {served or '?'}"))
    return found


def _tool_name(tool: Any) -> str:
    if not isinstance(tool, dict):
        return "?"
    function = tool.get("function")
    if isinstance(function, dict):
        return str(function.get("name"))
    return str(tool.get("name") or tool.get("type") or "?")


def raw(value: Any) -> str | None:
    if value is None:
        return None
    text = pretty_json(value)
    return text if len(text) <= RAW_CHARS else text[:RAW_CHARS] + "\n… (cut: see the API)"


def curl(shown: dict[str, Any]) -> str | None:
    """The request as a curl command to its upstream, the key as `$OPENAI_API_KEY`; None when
    the body is not JSON or was not stored."""
    request = shown["request"]
    if not isinstance(request, dict) or (list(request) == ["base64"]):
        return None
    url = shown["upstream_url"] + (f"?{shown['query']}" if shown["query"] else "")
    body = pretty_json(request)
    if len(body) > RAW_CHARS:
        return None
    lines = [
        f"curl {shlex.quote(url)}",
        "  -H 'Authorization: Bearer $OPENAI_API_KEY'".replace(
            "'Authorization", '"Authorization'
        ).replace("KEY'", 'KEY"'),
        "  -H 'Content-Type: application/json'",
        f"  -d {shlex.quote(body)}",
    ]
    return " \\\n".join(lines)


def tokens(decoded: Any) -> list[str]:
    """The counts an exchange's usage has, in words, from the figures decoded when it completed
    (`show`'s `tokens`): a class the exchange has none of (an embedding's completion, cached
    or reasoning tokens) is left out rather than shown as a dash."""
    if not isinstance(decoded, dict):
        return []
    prompt, cached = decoded.get("prompt"), decoded.get("cached")
    completion, reasoning = decoded.get("completion"), decoded.get("reasoning")
    out = []
    if prompt is not None:
        out.append(f"{prompt:,} prompt" + (f" ({cached:,} cached)" if cached else ""))
    if completion:
        extra = f" ({reasoning:,} reasoning)" if reasoning else ""
        out.append(f"{completion:,} completion{extra}")
    return out
