"""llama.cpp's servers' answers, byte for byte, as tests' upstreams.

Written from llama.cpp's `tools/server/server-task.cpp` (ggml-org/llama.cpp):

- `server_task_result_cmpl_partial::to_json_oaicompat_chat`: each chunk's members in the order
  `choices, created, id, model, system_fingerprint, object`; the first chunk's delta is
  `{"role": "assistant", "content": null}`; no `refusal`, no `logprobs` key unless logprobs
  were asked (then `{"content": [...]}` on the choice), no `usage` member.
- `server_task_result_cmpl_final::to_json_oaicompat_chat_stream`: the finish chunk
  (`"delta": {}`), then, only with `stream_options.include_usage`, the usage-only chunk
  (`"choices": []`). `timings` (`result_timings::to_json`) goes on whichever of the two is
  last.
- `server_task_result_cmpl_partial::to_json_oaicompat` (`/v1/completions`): `text_completion`
  chunks whose `logprobs` is chat-style, `{"content": [{id, token, bytes, logprob,
  top_logprobs}]}` (`completion_token_output::probs_vector_to_json`).
- nlohmann::json's `dump()`: no spaces; the SSE framing is `data: <json>\\n\\n`, then
  `data: [DONE]\\n\\n`.
"""

from __future__ import annotations

from typing import Any

import orjson

CREATED = 1_764_230_400
ID = "chatcmpl-Xq3pL0aB7cD9eF1gH2iJ4kL6mN8oP0qR"
MODEL = "tinyllama-1.1b-chat-v1.0.Q4_K_M.gguf"
FINGERPRINT = "b7140-3f3a3b2c"
TIMINGS = {
    "cache_n": 0,
    "prompt_n": 17,
    "prompt_ms": 35.118,
    "prompt_per_token_ms": 2.0657647058823527,
    "prompt_per_second": 484.08223702944356,
    "predicted_n": 3,
    "predicted_ms": 41.927,
    "predicted_per_token_ms": 13.975666666666667,
    "predicted_per_second": 71.55293724807403,
}
USAGE = {"completion_tokens": 3, "prompt_tokens": 17, "total_tokens": 20}


def _chunk(choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "choices": [choice],
        "created": CREATED,
        "id": ID,
        "model": MODEL,
        "system_fingerprint": FINGERPRINT,
        "object": "chat.completion.chunk",
        **extra,
    }


def _sse(chunks: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def chat_stream(include_usage: bool, texts: tuple[str, ...] = ("Hi", " there", "!")) -> bytes:
    """`/v1/chat/completions` streamed by llama-server, asked for usage or not."""
    chunks = [
        _chunk({"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}})
    ]
    chunks += [_chunk({"finish_reason": None, "index": 0, "delta": {"content": t}}) for t in texts]
    chunks.append(_chunk({"finish_reason": "length", "index": 0, "delta": {}}))
    if include_usage:
        usage_only = {**_chunk({}), "choices": [], "usage": USAGE}
        chunks.append(usage_only)
    chunks[-1]["timings"] = TIMINGS
    return _sse(chunks)


def token(text: str, logprob: float, top: list[tuple[str, float]], token_id: int) -> dict[str, Any]:
    """One entry of llama.cpp's chat-style logprobs (`probs_vector_to_json`)."""
    return {
        "id": token_id,
        "token": text,
        "bytes": list(text.encode()),
        "logprob": logprob,
        "top_logprobs": [
            {"id": token_id + i, "token": t, "bytes": list(t.encode()), "logprob": lp}
            for i, (t, lp) in enumerate(top)
        ],
    }


COMPLETION_TOKENS = [
    token("Hi", -0.25, [("Hi", -0.25), ("Hello", -1.5)], 6324),
    token(" there", -0.75, [(" there", -0.75), (" all", -2.0)], 727),
]


def completion_stream() -> bytes:
    """`/v1/completions` streamed by llama-server with `logprobs: 2`: one token a chunk, then
    the final chunk (no text, `logprobs: null`, usage and timings)."""
    chunks: list[dict[str, Any]] = []
    for entry in COMPLETION_TOKENS:
        choice = {
            "text": entry["token"],
            "index": 0,
            "logprobs": {"content": [entry]},
            "finish_reason": None,
        }
        chunks.append({**_chunk(choice), "object": "text_completion", "id": "cmpl-7Yq"})
    final = {"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}
    end = {**_chunk(final), "object": "text_completion", "id": "cmpl-7Yq"}
    chunks.append(
        {
            **end,
            "usage": {"completion_tokens": 2, "prompt_tokens": 4, "total_tokens": 6},
            "timings": TIMINGS,
        }
    )
    return _sse(chunks)


def chat_stream_with_logprobs() -> bytes:
    """llama-server's chat stream with `logprobs: true, top_logprobs: 2`: each token's chunk
    carries `"logprobs": {"content": [...]}` on its choice, no `refusal` key anywhere."""
    chunks = [
        _chunk({"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}})
    ]
    for entry in COMPLETION_TOKENS:
        choice = {"finish_reason": None, "index": 0, "delta": {"content": entry["token"]}}
        chunks.append(_chunk({**choice, "logprobs": {"content": [entry]}}))
    chunks.append(_chunk({"finish_reason": "length", "index": 0, "delta": {}}, timings=TIMINGS))
    return _sse(chunks)


def python_chat_stream() -> bytes:
    """llama-cpp-python's server (`llama_chat_format._convert_text_completion_chunks_to_chat`):
    members `id, model, created, object, choices`; every choice has `logprobs: null`; the first
    delta is `{"role": "assistant"}`, then `{"content": ...}`, the last `{}`."""

    def chunk(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        head = {"id": "chatcmpl-5b1f", "model": "tiny.gguf", "created": CREATED}
        return {**head, "object": "chat.completion.chunk", "choices": [choice]}

    chunks = [chunk({"role": "assistant"}, None), chunk({"content": "Hi"}, None)]
    return _sse([*chunks, chunk({}, "stop")])
