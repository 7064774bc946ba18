"""`rows.rows_for` on fields a vendor or a client made odd: the exchange row's text and
float columns take the fast path only when every value is plain, and anything else comes out
as `_text` and `_float` make it one by one."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.store import rows as r
from proxy.store import tables as t
from proxy.store.logprob_rows import _list_json, logprob_records
from proxy.store.threads import keys
from proxy.text import dumps
from proxy.usage import Usage
from tests.dbs import chat_exchange

TEXTS = (
    *("method", "path", "query", "upstream", "upstream_url", "model", "response_model"),
    *("outcome", "error", "content_type", "upstream_request_id", "key_hash", "key_hint"),
    *("user", "replay_of", "usage_source", "system_fingerprint", "price_entry", "session"),
    "service_tier",
)
COLUMN = {"user": "end_user"}
FLOATS = ("ttfb_ms", "ttft_ms", "duration_ms", "cost_usd")
DEFAULTS = {
    "method": "",
    "path": "",
    "query": "",
    "upstream": "",
    "upstream_url": "",
    "outcome": "ok",
}


class Text(str):
    pass


@pytest.mark.parametrize("field", TEXTS)
@pytest.mark.parametrize("value", ["a\x00b", 7, b"bytes", "", Text("sub"), None])
def test_each_text_column_is_what_text_makes_of_its_field(field: str, value: Any) -> None:
    ex = chat_exchange(fingerprint=None)
    ex.response_json.pop("model")  # no fallback for `response_model` from the response
    ex.status = 201  # not a Batch API answer: its rows read `path` as text
    setattr(ex, field, value)
    row = r.exchange_fields(r.rows_for(ex).exchange)
    for name in TEXTS:
        expected = r._text(getattr(ex, name))
        if name in DEFAULTS:
            expected = expected or DEFAULTS[name]
        elif name in ("response_model", "system_fingerprint"):
            expected = expected or None  # the response has neither to fall back on
        assert row[COLUMN.get(name, name)] == expected
        assert type(row[COLUMN.get(name, name)]) is type(expected)


@pytest.mark.parametrize("field", FLOATS)
@pytest.mark.parametrize("value", [3, True, "1.5", 2.5, None, float("inf")])
def test_each_float_column_is_what_float_makes_of_its_field(field: str, value: Any) -> None:
    ex = chat_exchange()
    setattr(ex, field, value)
    row = r.exchange_fields(r.rows_for(ex).exchange)
    assert row[field] == r._float(value)
    assert type(row[field]) is type(r._float(value))


def test_a_usage_row_keeps_each_count_in_its_column_and_drops_one_past_the_range() -> None:
    counts = Usage(*(i + 1 for i in range(len(Usage._fields))))
    record = r.usage_row(
        "x", {"prompt_tokens": 1}, counts._replace(reasoning=2**31, total=2**31 - 1)
    )
    row = r.named(t.usage, record)
    assert row == {
        "exchange_id": "x",
        "prompt_tokens": counts.input,
        "completion_tokens": counts.output,
        "total_tokens": 2**31 - 1,
        "cached_tokens": counts.cached,
        "prompt_audio_tokens": counts.input_audio,
        "reasoning_tokens": None,  # past the column's range
        "completion_audio_tokens": counts.output_audio,
        "accepted_prediction_tokens": counts.accepted_prediction,
        "rejected_prediction_tokens": counts.rejected_prediction,
        "raw": '{"prompt_tokens":1}',
        "cache_write_tokens": counts.cache_write,
        "cached_audio_tokens": counts.cached_audio,
        "prompt_image_tokens": counts.input_image,
        "cached_image_tokens": counts.cached_image,
        "completion_image_tokens": counts.output_image,
    }
    assert r.named(t.usage, r.usage_row("x", {}, None)) == {
        **dict.fromkeys(row, None),
        "exchange_id": "x",
        "raw": "{}",
    }


@pytest.mark.parametrize(
    ("field", "limit", "default"),
    [("status", 2**31, None), ("response_bytes", 2**63, 0), ("chunks", 2**31, 0)],
)
@pytest.mark.parametrize("shift", [0, 1])
@pytest.mark.parametrize("value", [7, True, 2.0, "3", None, -1])
def test_each_int_column_is_what_int_makes_of_its_field(
    field: str, limit: int, default: int | None, shift: int, value: Any
) -> None:
    """Plain ints in range are taken as they are; the rest (bools, floats, text, one past the
    column's range either way) as `_int` makes them."""
    ex = chat_exchange()
    ex.status = 201  # not a Batch API answer
    for given in (value, limit - 1 + shift, -limit - shift):
        setattr(ex, field, given)
        expected = r._int(given, limit)
        if field != "status":
            expected = expected or default
        row = r.exchange_fields(r.rows_for(ex).exchange)
        assert row[field] == expected
        assert type(row[field]) is type(expected)


class Pair(tuple[int, float]):
    pass


@pytest.mark.parametrize(
    "pacing",
    [
        [(0, 1.5), (120, 80.25)],
        [[0, 1.5], (120, 80.25)],
        [Pair((0, 1.5)), (1, 2.0)],
        [(1 << 70, 1.0)],
        [],
    ],
)
def test_a_streams_pacing_is_stored_as_json_lists_of_pairs(pacing: list[Any]) -> None:
    ex = chat_exchange()
    ex.raw_stream_gz, ex.raw_pacing = b"gz", pacing
    stored = r.named(t.raw_streams, r.rows_for(ex).raw_streams[0])["pacing"]
    assert stored == dumps([list(p) for p in pacing])


def test_the_exchange_record_holds_each_value_in_its_own_column() -> None:
    """Every column of the record (built as a tuple, not by name) holds its own field: each
    field set to a value no other column holds."""
    ex = chat_exchange()
    ex.status, ex.stream, ex.omit_request = 201, True, True  # not a Batch API answer
    for at, name in enumerate(TEXTS):
        setattr(ex, name, f"text-{at}")
    for at, name in enumerate(FLOATS):
        setattr(ex, name, at + 0.5)
    ex.response_bytes, ex.chunks = 2**40, 7
    ex.parse_errors, ex.redacted = ["bad"], {"n": 1}
    ex.request_json["messages"].append({"role": "assistant", "content": "hi"})  # a parent key
    row = r.exchange_fields(r.rows_for(ex).exchange)
    expected: dict[str, Any] = {
        COLUMN.get(name, name): f"text-{at}" for at, name in enumerate(TEXTS)
    }
    expected |= {name: at + 0.5 for at, name in enumerate(FLOATS)}
    expected |= {"id": ex.id, "status": 201, "stream": True, "response_bytes": 2**40}
    expected |= {"chunks": 7, "parse_errors": '["bad"]', "redacted": '{"n":1}'}
    expected |= {"request": None, "request_body": None, "request_omitted": True}
    assert ex.response_body is not None
    expected |= {"response": ex.response_body.decode(), "response_body": None}
    expected |= {"response_omitted": False}
    turn, parent = keys(ex.request_json, ex.response_json)
    assert turn and parent and turn != parent
    expected |= {"turn_key": turn, "parent_key": parent}
    assert {name: row[name] for name in expected} == expected
    assert row["started_at"].timestamp() == pytest.approx(ex.started_at, abs=1e-6)
    assert set(row) - set(expected) == {"started_at"}


def test_each_child_record_holds_each_value_in_its_own_column() -> None:
    """The child rows are built as tuples too: each column's value differs from its
    neighbours', so two swapped in `rows.py` fail here."""
    ex = chat_exchange(tags={"team": "blue"})
    ex.raw_stream_gz, ex.raw_pacing = b"gz", [(1, 2.0)]
    answer: dict[str, Any] = {"role": "assistant", "content": "hi", "refusal": "no"}
    answer |= {"audio": {"id": "a"}, "tool_calls": [{"id": "t"}], "function_call": {"name": "f"}}
    ex.response_json = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 17,
        "model": "m-1",
        "system_fingerprint": "fp-1",
        "service_tier": "tier-1",
        "choices": [{"index": 3, "message": answer, "finish_reason": "length"}],
    }
    ex.response_body = None
    rows = r.rows_for(ex)
    assert [r.named(t.tags, tag) for tag in rows.tags] == [
        {"exchange_id": ex.id, "key": "team", "value": "blue"}
    ]
    assert [r.named(t.completions, row) for row in rows.completions] == [
        {
            "exchange_id": ex.id,
            "completion_id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 17,
            "model": "m-1",
            "system_fingerprint": "fp-1",
            "service_tier": "tier-1",
        }
    ]
    assert [r.named(t.choices, row) for row in rows.choices] == [
        {
            "exchange_id": ex.id,
            "choice_index": 3,
            "role": "assistant",
            "content": "hi",
            "refusal": "no",
            "finish_reason": "length",
            "tool_calls": '[{"id":"t"}]',
            "function_call": '{"name":"f"}',
            "audio": '{"id":"a"}',
        }
    ]
    assert [r.named(t.raw_streams, row) for row in rows.raw_streams] == [
        {"exchange_id": ex.id, "gz": b"gz", "pacing": "[[1,2.0]]"}
    ]


def test_a_tokens_json_columns_are_what_list_json_makes_of_each() -> None:
    """Two plain lists are serialised at once; anything else (a value that is not a list, one
    orjson refuses) goes through `_list_json`, each column on its own."""
    tokens: list[Any] = [
        {"token": "a", "bytes": [97], "top_logprobs": [{"token": "a", "logprob": -1.0}]},
        {"token": "b", "bytes": "98", "top_logprobs": [{"n": 1 << 70}]},
        {"token": "c", "bytes": [99], "top_logprobs": [{1: 2}]},
        {"token": "d", "bytes": None, "top_logprobs": ()},
    ]
    found = logprob_records("x", 0, "content", tokens)
    assert [record[6:] for record in found] == [
        (_list_json(token["bytes"]), _list_json(token["top_logprobs"])) for token in tokens
    ]
    assert found[1][6:] == (None, '[{"n": 1180591620717411303424}]')
    assert found[2][6:] == ("[99]", '[{"1":2}]')
