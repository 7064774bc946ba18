"""Comparing a replay with its original: what `flightrec replay` prints and the console's
replay diff shows. Pure: two `show --json` objects in, one comparison out."""

from __future__ import annotations

import difflib
from typing import Any

import orjson

from proxy.text import printable

_VOLATILE = frozenset(
    {"id", "created", "model", "system_fingerprint", "usage", "service_tier", "timings"}
)
"""Response fields that differ between two identical answers (`timings`: llama.cpp's)."""


def _choices(response: Any) -> list[dict[str, Any]]:
    found = response.get("choices") if isinstance(response, dict) else None
    if not isinstance(found, list):
        return []
    choices = [c for c in found if isinstance(c, dict)]
    return sorted(choices, key=lambda c: c["index"] if isinstance(c.get("index"), int) else 0)


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts
        return "".join(str(p.get("text", "")) for p in value if isinstance(p, dict)) or None
    return None


def content_of(response: Any) -> str | None:
    """The generated text: message content (or refusal) of each choice, a legacy completion's
    `text`, or a Responses API answer's output text. None when the response has none."""
    choices = _choices(response)
    parts: list[str] = []
    for choice in choices:
        message = choice.get("message")
        if isinstance(message, dict):
            text = _text(message.get("content")) or _text(message.get("refusal"))
        else:
            text = _text(choice.get("text"))
        if text is not None:
            parts.append(text if len(choices) == 1 else f"[{choice.get('index')}] {text}")
    output = response.get("output") if isinstance(response, dict) else None
    for item in output if isinstance(output, list) else []:
        content = item.get("content") if isinstance(item, dict) else None
        for part in content if isinstance(content, list) else []:
            if isinstance(part, dict) and part.get("type") == "output_text":
                parts.append(str(part.get("text", "")))
    return "\n".join(parts) if parts else None


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def tool_calls_of(response: Any) -> list[list[tuple[Any, Any]]]:
    """Per choice, the calls as (name, arguments): call ids are random, argument JSON is
    compared parsed, so whitespace does not count as a change."""
    calls = []
    for choice in _choices(response):
        found_message = choice.get("message")
        message: dict[str, Any] = found_message if isinstance(found_message, dict) else {}
        found = [c.get("function") for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        if isinstance(message.get("function_call"), dict):
            found.append(message["function_call"])
        calls.append(
            [(f.get("name"), _arguments(f.get("arguments"))) for f in found if isinstance(f, dict)]
        )
    return calls


def _finish_reasons(response: Any) -> list[Any]:
    reasons = [choice.get("finish_reason") for choice in _choices(response)]
    if not reasons and isinstance(response, dict) and "output" in response:
        reasons = [response.get("status")]
    return reasons


def _tokens(tokens: Any, name: str) -> int | None:
    """One count of `show`'s `tokens` (the usage as decoded when the exchange completed)."""
    value = tokens.get(name) if isinstance(tokens, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _delta(new: float | None, old: float | None, digits: int) -> float | None:
    return None if new is None or old is None else round(new - old, digits)


def _stripped(response: Any) -> Any:
    if isinstance(response, dict):
        return {k: v for k, v in response.items() if k not in _VOLATILE}
    return response


def _generated(response: Any) -> bool:
    """Whether `response` is a generation (choices or Responses API output): what it means is
    its text, tool calls and finish reasons, never its ids or a vendor's extras."""
    return isinstance(response, dict) and ("choices" in response or "output" in response)


def meaning(response: Any) -> list[str]:
    """What a user reads in an answer, as lines: its text, then each tool call (name and
    arguments, ids left out), then its finish reasons."""
    lines = (content_of(response) or "").splitlines()
    for index, calls in enumerate(tool_calls_of(response)):
        for name, arguments in calls:
            shown = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()
            lines.append(f"[tool call {index}] {name}({shown})")
    reasons = _finish_reasons(response)
    if reasons:
        lines.append(f"[finish reason] {', '.join(str(r) for r in reasons)}")
    return lines


def content_diff(original: Any, replayed: Any) -> str:
    """A unified diff of what two answers mean (`meaning`), one line per line, each ending in a
    newline whether the answers' text did or not; empty when they mean the same."""
    old, new = meaning(original), meaning(replayed)
    if old == new:
        return ""
    lines = difflib.unified_diff(old, new, "original", "replay", lineterm="")
    return "".join(line + "\n" for line in lines)


def compare(original: dict[str, Any], replayed: dict[str, Any]) -> dict[str, Any]:
    """One `replay --json` object: what changed between an exchange and its replay."""
    old, new = original["response"], replayed["response"]
    old_text, new_text = content_of(old), content_of(new)
    same_content = (
        old_text == new_text
        if _generated(old) or _generated(new) or old_text is not None or new_text is not None
        else _stripped(old) == _stripped(new)
    )
    old_fp, new_fp = original["system_fingerprint"], replayed["system_fingerprint"]
    old_tokens, new_tokens = original["tokens"], replayed["tokens"]
    usage_delta = {
        f"{name}_tokens": _delta(_tokens(new_tokens, name), _tokens(old_tokens, name), 0)
        for name in ("prompt", "completion", "total")
    }
    return {
        "original": original["id"],
        "replay": replayed["id"],
        "original_model": original["response_model"] or original["model"],
        "replay_model": replayed["response_model"] or replayed["model"],
        "status": replayed["status"],
        "outcome": replayed["outcome"],
        "error": replayed["error"],
        "same_content": same_content and original["outcome"] == replayed["outcome"],
        "same_tool_calls": tool_calls_of(old) == tool_calls_of(new),
        "same_finish_reason": _finish_reasons(old) == _finish_reasons(new),
        "fingerprint_changed": None if old_fp is None or new_fp is None else old_fp != new_fp,
        "usage_delta": {k: None if v is None else int(v) for k, v in usage_delta.items()},
        "cost_delta_usd": _delta(replayed["cost_usd"], original["cost_usd"], 10),
        "latency_delta_ms": _delta(replayed["duration_ms"], original["duration_ms"], 1),
        "diff": content_diff(old, new),
    }


def failed(original: dict[str, Any], error: str) -> dict[str, Any]:
    """The `replay --json` object of a replay that left nothing to compare: `error` says why."""
    return {
        "original": original["id"],
        "replay": None,
        "original_model": original["response_model"] or original["model"],
        "replay_model": None,
        "status": None,
        "outcome": "replay_failed",
        "error": error,
        "same_content": False,
        "same_tool_calls": False,
        "same_finish_reason": False,
        "fingerprint_changed": None,
        "usage_delta": dict.fromkeys(("prompt_tokens", "completion_tokens", "total_tokens")),
        "cost_delta_usd": None,
        "latency_delta_ms": None,
        "diff": "",
    }


def _signed(value: float | None, unit: str = "", digits: int = 0) -> str:
    return "?" if value is None else f"{value:+.{digits}f}{unit}"


def render(comparisons: list[dict[str, Any]]) -> str:
    """`replay` for people: one block per replay, with the text diff when the answer changed."""
    blocks = []
    for c in comparisons:
        if c["replay"] is None:
            blocks.append(f"{c['original']} -> no replay ({c['outcome']})\n  error: {c['error']}")
            continue
        usage = c["usage_delta"]
        fingerprint = {None: "unknown", True: "changed", False: "same"}[c["fingerprint_changed"]]
        lines = [
            f"{c['original']} -> {c['replay']}  ({c['original_model']} -> {c['replay_model']}, "
            f"{c['status']} {c['outcome']})",
            f"  content {'same' if c['same_content'] else 'DIFFERS'}, "
            f"tool calls {'same' if c['same_tool_calls'] else 'DIFFER'}, "
            f"finish reason {'same' if c['same_finish_reason'] else 'DIFFERS'}, "
            f"fingerprint {fingerprint}",
            f"  tokens prompt {_signed(usage['prompt_tokens'])}, "
            f"completion {_signed(usage['completion_tokens'])}; "
            f"cost {_signed(c['cost_delta_usd'], ' USD', 6)}; "
            f"latency {_signed(c['latency_delta_ms'], ' ms')}",
        ]
        if c["error"]:
            lines.append(f"  error: {c['error']}")
        if c["diff"]:
            lines.append(c["diff"].rstrip("\n"))
        blocks.append("\n".join(lines))
    return printable("\n\n".join(blocks))
