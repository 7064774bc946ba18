"""What the templates draw, computed in Python: messages by role, logprob colours, the stream
timeline's SVG geometry and the word diff of a replay. No I/O; every string it returns is
escaped by the templates (autoescape), so recorded content only ever becomes text."""

from __future__ import annotations

import difflib
import itertools
import math
import re
from typing import Any

import orjson

LOGPROB_CLASSES = 10
SHOWN_CHARS = 20_000
"""A longer message shows its beginning and links to a page with all of it."""


def pretty_json(value: Any) -> str:
    if isinstance(value, str):
        text = value
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            return text
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()


def _text(content: Any) -> str | None:
    """Message content as text: a string, or the text of its parts (others named)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(isinstance(p, int) for p in content):
        return f"[{len(content)} token ids]"
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(part["text"])
            elif isinstance(part, dict):
                out.append(_part_note(part))
            elif isinstance(part, str):  # embeddings and moderations take lists of strings
                out.append(part)
        return "\n".join(out)
    return pretty_json(content)


def _part_note(part: dict[str, Any]) -> str:
    """A non-text part named, with what it points at: `[image: https://...]`, `[audio: wav]`."""
    kind = str(part.get("type", "part"))
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else image
    if isinstance(url, str):
        where = f"inline, {len(url) * 3 // 4 // 1024} KB" if url.startswith("data:") else url
        return f"[image: {where[:200]}]"
    audio = part.get("input_audio")
    if isinstance(audio, dict):
        size = len(str(audio.get("data", ""))) * 3 // 4 // 1024
        return f"[audio: {audio.get('format', '?')}, {size} KB]"
    return f"[{kind}]"


def _calls(message: dict[str, Any]) -> list[dict[str, str]]:
    found = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
    calls = []
    for call in found:
        found_function = call.get("function")
        function: dict[str, Any] = found_function if isinstance(found_function, dict) else {}
        calls.append(
            {
                "id": str(call.get("id") or ""),
                "name": str(function.get("name") or call.get("type") or "?"),
                "arguments": pretty_json(function.get("arguments", "")),
            }
        )
    legacy = message.get("function_call")
    if isinstance(legacy, dict):
        calls.append(
            {
                "id": "",
                "name": str(legacy.get("name") or "?"),
                "arguments": pretty_json(legacy.get("arguments", "")),
            }
        )
    return calls


def message_view(message: Any) -> dict[str, Any]:
    if not isinstance(message, dict):
        return {"role": "?", "content": pretty_json(message), "refusal": None, "calls": []}
    return {
        "role": str(message.get("role") or "?"),
        "name": message.get("name"),
        "tool_call_id": message.get("tool_call_id"),
        "content": _text(message.get("content")),
        "refusal": message.get("refusal"),
        "calls": _calls(message),
    }


def cut(message: dict[str, Any], full_url: str) -> None:
    """Shorten a long message's text in place, noting how much and where the whole is."""
    text = message.get("content")
    message["cut"] = None
    if isinstance(text, str) and len(text) > SHOWN_CHARS:
        message["content"] = text[:SHOWN_CHARS]
        message["cut"] = {"shown": SHOWN_CHARS, "total": len(text), "url": full_url}


def is_binary(body: Any) -> bool:
    """A stored body that was not UTF-8 reads back as `{"base64": ...}`."""
    return isinstance(body, dict) and list(body) == ["base64"]


def conversation(request: Any) -> list[dict[str, Any]]:
    """The request's messages (chat), `instructions` and `input` (Responses API: a string or
    items), or `prompt` / `input` (completions, embeddings, moderations)."""
    if not isinstance(request, dict):
        return []
    if isinstance(request.get("messages"), list):
        return [message_view(m) for m in request["messages"]]
    out = []
    if isinstance(request.get("instructions"), str):
        out.append(message_view({"role": "system", "content": request["instructions"]}))
    found = request.get("input")
    if isinstance(found, list) and all(isinstance(item, dict) for item in found):
        return out + [_item_view(item, "user") for item in found]
    for name in ("prompt", "input"):
        if name in request:
            return [*out, message_view({"role": "user", "content": _text(request[name])})]
    return out


def _parts(content: Any, kind: str) -> str | None:
    """The `kind` texts of a Responses content list (`refusal` parts hold `refusal`)."""
    if not isinstance(content, list):
        return None
    key = "refusal" if kind == "refusal" else "text"
    found = [p[key] for p in content if isinstance(p, dict) and p.get("type") == kind]
    return "\n".join(str(text) for text in found) or None


def _item_view(item: dict[str, Any], role: str) -> dict[str, Any]:
    """One Responses API item (input or output) by its type; unknown types as JSON."""
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        view = message_view({"role": role, **item})
        content = item.get("content")
        if isinstance(content, list):
            texts = [p for p in content if not (isinstance(p, dict) and p.get("type") == "refusal")]
            view["content"] = _text(texts) or None
            view["refusal"] = _parts(content, "refusal")
        return view
    if kind == "reasoning":
        summary = _parts(item.get("summary"), "summary_text")
        text = summary or _parts(item.get("content"), "reasoning_text")
        return message_view({"role": "reasoning", "content": text or "(no summary)"})
    if kind in ("function_call", "custom_tool_call"):
        arguments = item.get("arguments", item.get("input", ""))
        call = {"id": item.get("call_id"), "function": {"name": item.get("name"),
                                                        "arguments": arguments}}  # fmt: skip
        return message_view({"role": "assistant", "tool_calls": [call]})
    if kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        return message_view(
            {"role": "tool", "tool_call_id": item.get("call_id"), "content": _text(output)}
        )
    return message_view({"role": str(kind or "item"), "content": pretty_json(item)})


def _embeddings(found: list[Any]) -> dict[str, Any]:
    vectors = [d.get("embedding") for d in found if isinstance(d, dict)]
    sizes = set()
    for vector in vectors:
        if isinstance(vector, list):
            sizes.add(len(vector))
        elif isinstance(vector, str):  # encoding_format=base64: float32 values
            sizes.add(len(vector) * 3 // 4 // 4)
    dimensions = ", ".join(str(n) for n in sorted(sizes)) or "?"
    text = f"{len(vectors)} embedding{'' if len(vectors) == 1 else 's'} of {dimensions} dimensions"
    return message_view({"role": "embeddings", "content": text})


def answers(response: Any) -> list[dict[str, Any]]:
    """Every choice of a chat or legacy completion (by index), a Responses API answer's
    output items, a transcription's text, or a summary of embeddings."""
    if not isinstance(response, dict):
        return []
    found = response.get("choices")
    if not isinstance(found, list):
        output = response.get("output")
        if isinstance(output, list):
            return [_item_view(item, "assistant") for item in output if isinstance(item, dict)]
        if isinstance(response.get("text"), str):
            return [message_view({"role": "transcript", "content": response["text"]})]
        data = response.get("data")
        if isinstance(data, list) and any(isinstance(d, dict) and "embedding" in d for d in data):
            return [_embeddings(data)]
        return []
    out = []
    for choice in found:
        if not isinstance(choice, dict):
            continue
        message = choice.get("message")
        view = message_view(
            message if isinstance(message, dict) else {"content": choice.get("text")}
        )
        if view["role"] == "?":
            view["role"] = "assistant"
        view["index"] = choice.get("index")
        view["finish_reason"] = choice.get("finish_reason")
        out.append(view)
    return out


def _probability_class(logprob: Any) -> str:
    if not isinstance(logprob, int | float) or not math.isfinite(logprob):
        return "lpn"
    p = math.exp(min(0.0, float(logprob)))
    return f"lp{min(LOGPROB_CLASSES - 1, int(p * LOGPROB_CLASSES))}"


def logprob_view(choices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The logprobs API's choices with a colour class and readable alternatives per token."""
    out = []
    for choice in choices:
        tokens = []
        for token in choice["tokens"]:
            logprob = token["logprob"]
            alternatives = [
                (str(alt.get("token", "")), _percent(alt.get("logprob")))
                for alt in token["top_logprobs"]
                if isinstance(alt, dict)
            ]
            tokens.append(
                {
                    "text": token["token"],
                    "css": _probability_class(logprob),
                    "p": _percent(logprob),
                    "logprob": logprob,
                    "alternatives": alternatives,
                }
            )
        out.append({**choice, "tokens": tokens})
    return out


def _percent(logprob: Any) -> str:
    if not isinstance(logprob, int | float) or not math.isfinite(logprob):
        return "?"
    return f"{100 * math.exp(min(0.0, float(logprob))):.1f}%"


def timeline(found: dict[str, Any], width: int = 640, height: int = 140) -> dict[str, Any] | None:
    """Bytes over time as an SVG polyline, with TTFT and the longest gap between writes."""
    pacing = found["pacing"]
    if not pacing:
        return None
    end_ms = float(max(found["duration_ms"] or 0.0, pacing[-1][1], 1.0))
    total = float(max(pacing[-1][0], 1))
    pad = 30

    def x(ms: float) -> float:
        return round(pad + (width - 2 * pad) * ms / end_ms, 1)

    def y(size: float) -> float:
        return round(height - pad - (height - 2 * pad) * size / total, 1)

    points = [(x(0), y(0))]
    for size, ms in pacing:
        points.append((x(ms), points[-1][1]))
        points.append((x(ms), y(size)))
    gap = (0.0, 0.0)
    for (_, before), (_, after) in itertools.pairwise(pacing):
        if after - before > gap[1] - gap[0]:
            gap = (before, after)
    ttft = found["ttft_ms"]
    return {
        "width": width,
        "height": height,
        "points": " ".join(f"{px},{py}" for px, py in points),
        "ttft_x": None if ttft is None else x(ttft),
        "ttft_ms": ttft,
        "gap": None if gap[1] <= gap[0] else (x(gap[0]), x(gap[1]), round(gap[1] - gap[0], 1)),
        "end_ms": round(end_ms, 1),
        "bytes": pacing[-1][0],
        "writes": len(pacing),
        "top": pad,
        "bottom": height - pad,
    }


WORD_DIFF_CHARS = 50_000
_WORDS = re.compile(r"\s+|[^\s\w]|\w+")


def word_diff(old: str | None, new: str | None) -> tuple[list[Any], list[Any]]:
    """Both texts as (text, kind) runs, kind `same`, `del` (left) or `ins` (right)."""
    if len(old or "") + len(new or "") > WORD_DIFF_CHARS:
        # Word diffs grow with the square of the text: long answers are compared by lines.
        a, b = (old or "").splitlines(keepends=True), (new or "").splitlines(keepends=True)
    else:
        a, b = _WORDS.findall(old or ""), _WORDS.findall(new or "")
    left: list[tuple[str, str]] = []
    right: list[tuple[str, str]] = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            left.append(("".join(a[i1:i2]), "same"))
            right.append(("".join(b[j1:j2]), "same"))
            continue
        if i2 > i1:
            left.append(("".join(a[i1:i2]), "del"))
        if j2 > j1:
            right.append(("".join(b[j1:j2]), "ins"))
    return left, right
