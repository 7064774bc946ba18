"""Redaction rules and `store_bodies` (proxy/privacy/redact.py, proxy/privacy/keep.py): the
presets, the config errors, JSON walked after parsing (escapes, keys, depth, JSON in strings),
raw bodies, what is dropped from an answer, and `store_bodies = "metadata"` through the real
proxy."""

from __future__ import annotations

import copy
import gzip
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from proxy.config import Config, ConfigError, load
from proxy.exchange import Exchange
from proxy.privacy import keep
from proxy.privacy.keep import Keep
from proxy.privacy.redact import PRESETS, Hits, Redactor, luhn, parse_rules
from proxy.sinks.otlp import SpanBuilder
from proxy.sinks.settle import settle
from proxy.store import create_engine
from tests import dbs
from tests.recordings import answer_by_model, config_for, fake_upstream, record_two

db_url = dbs.db_url  # fixture

ALL = Redactor(parse_rules([{"preset": name} for name in PRESETS], ConfigError))


def redact(text: str) -> tuple[str, Hits]:
    hits: Hits = set()
    return ALL.text(text, hits), hits


@pytest.mark.parametrize(
    ("found", "rule"),
    [
        ("jane.doe+tag@mail.example.co.uk", "email"),
        ("4111 1111 1111 1111", "card"),
        ("4111-1111-1111-1111", "card"),
        ("378282246310005", "card"),
        ("+1 (555) 123-4567", "phone"),
        ("555-123-4567", "phone"),
        ("(555) 123 4567", "phone"),
        ("+44 20 7946 0958", "phone"),
        ("sk-abcdefghijklmnopqrstuvwx01", "api_key"),
        ("sk-proj-AbC_dEf-GhIjKlMnOpQrStUv", "api_key"),
        ("Bearer abcdefghijklmnop.qrstuvwx", "api_key"),
        ("bearer abcdefghijklmnop.qrstuvwx", "api_key"),
        ("BEARER abcdefghijklmnop.qrstuvwx", "api_key"),
        ("AKIAIOSFODNN7EXAMPLE", "api_key"),
        ("ghp_" + "a" * 36, "api_key"),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N", "api_key"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIE\n-----END RSA PRIVATE KEY-----", "api_key"),
    ],
)
def test_each_preset_replaces_what_it_is_for(found: str, rule: str) -> None:
    text = f"see: {found}, then"
    assert redact(text) == (f"see: [REDACTED:{rule}], then", {rule})


@pytest.mark.parametrize(
    "text",
    [
        "order 4111 1111 1111 1112",  # Luhn-invalid: an order id, not a card
        "released 2024-01-15, version 1.2.3, host 192.168.1.10",
        "pi is 3.14159265358979323846",
        "task-abcdefghijklmnopqrstuvwxyz and risk-0123456789012345678901",
        "Bearer authentication is a scheme; user@localhost has no domain",
        "id 0199a1b2-7c3d-7e4f-8a9b-0c1d2e3f4a5b",
        "id chatcmpl-AUbenchmock0000000000000000 and 4111111111111111x",
        "item 3 4111 1111 1111 1112, qty 1 4111111111111112",  # Luhn-invalid after a number
        "v1.4111111111111111 and 4111 1111 1111 1111x and 0 0000 0000 0000 0000",
        "[REDACTED:email] stays",
    ],
)
def test_what_only_looks_like_it_is_kept(text: str) -> None:
    assert redact(text) == (text, set())


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("item 3 4111 1111 1111 1111", "item 3 "),
        ("exp 2025 4111 1111 1111 1111", "exp 2025 "),
        ("qty 1 4111111111111111", "qty 1 "),
        ("order 7-4111-1111-1111-1111", "order 7-"),
        ("4111 1111 1111 1111 22 pcs", " 22 pcs"),  # a card, then another number
        ("1 2 3 4111 1111 1111 1111 4 5", "1 2 3  4 5"),
    ],
)
def test_a_card_beside_other_numbers_is_found(text: str, kept: str) -> None:
    out, hits = redact(text)
    assert out.replace("[REDACTED:card]", "") == kept and out.count("[REDACTED:card]") == 1
    assert hits == {"card"}


def test_luhn() -> None:
    assert luhn("4111 1111 1111 1111") and luhn("79927398713")
    assert not luhn("4111 1111 1111 1112") and not luhn("79927398710")


def test_a_long_run_without_a_match_is_searched_in_linear_time() -> None:
    # Bounded repeats: a 1 MB base64-like run with an "@" at its end must not backtrack
    # quadratically (this would not finish in minutes otherwise).
    text = "A" * 1_000_000 + "@"
    assert redact(text) == (text, set())


@pytest.mark.parametrize(
    "text",
    [
        "-----BEGIN RSA PRIVATE KEY-----" * 100_000,  # each header's body ran into the next
        "eyJ" * 100_000,  # a JWT was tried again from each "eyJ" inside the run
        "1" * 1_000_000,
        "1 " * 500_000,  # a card is tried at each group
    ],
)
def test_megabytes_of_what_starts_a_match_is_searched_in_linear_time(text: str) -> None:
    # No preset may rescan what it has scanned: quadratic (or 8000-fold) work took from 2 s
    # to minutes here; linear takes well under 1 s. The bound catches only that, on a busy
    # machine too.
    begin = time.perf_counter()
    assert redact(text) == (text, set())
    assert time.perf_counter() - begin < 5


def test_rules_from_config_and_their_errors(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[[redact]]\npreset = "email"\n\n[[redact]]\nname = "ticket"\n'
        'pattern = "TICKET-[0-9]{3}"\nreplace = "T-\\\\1***"\n'
    )
    config = load(path, env={})
    assert [(r.name, r.preset, r.replace) for r in config.redact] == [
        ("email", "email", "[REDACTED:email]"),
        ("ticket", None, "T-\\1***"),
    ]
    hits: Hits = set()
    assert Redactor(config.redact).text("TICKET-123 a@b.io", hits) == "T-\\1*** [REDACTED:email]"
    assert hits == {"email", "ticket"}
    env = load(path, env={"FLIGHTREC_REDACT": "api_key, phone"}).redact
    assert [r.name for r in env] == ["api_key", "phone"]
    for text, message in [
        ('[[redact]]\npattern = "("', "redact[0].pattern: not a valid regular expression"),
        ('[[redact]]\npreset = "email"\n[[redact]]\npattern = "[a-"', "redact[1].pattern"),
        ('[[redact]]\npattern = "x*"', "redact[0].pattern: matches the empty string"),
        ('[[redact]]\npattern = "\\\\b"', "redact[0].pattern: can only match an empty"),
        ('[[redact]]\npattern = "(?=a)"', "redact[0].pattern: can only match an empty"),
        ('[[redact]]\npreset = "ssn"', "redact[0].preset: expected one of email, card, phone"),
        ('[[redact]]\nname = "x"', "redact[0]: give either preset or pattern"),
        ('[[redact]]\npreset = "email"\npattern = "x"', "redact[0]: give either"),
        ('[[redact]]\npreset = "card"\n[[redact]]\npreset = "card"', "redact[1].name: 'card'"),
        ('[[redact]]\npreset = "card"\nwith = 1', "redact[0].with: unknown key"),
        ('[[redact]]\npreset = "card"\nreplace = 3', "redact[0].replace: expected a string"),
        ('redact = "email"', "redact: expected an array of tables"),
        ('store_bodies = "none"', "store_bodies: expected one of full, metadata"),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigError) as caught:
            load(path, env={})
        assert message in str(caught.value) and "\n" not in str(caught.value)


def test_an_empty_match_is_never_replaced() -> None:
    hits: Hits = set()
    rules = parse_rules([{"pattern": "\\b|x"}, {"name": "a", "pattern": "(?=a)|y"}], ConfigError)
    assert Redactor(rules).text("ab x cd ya", hits) == "ab [REDACTED:pattern] cd [REDACTED:a]a"
    assert hits == {"pattern", "a"}


def test_no_rule_means_nothing_is_searched() -> None:
    assert Keep(Config()).redactor is None


def _exchange(**fields: Any) -> Exchange:
    ex = Exchange.start("POST", "/v1/chat/completions", "", "openai")
    for name, value in fields.items():
        setattr(ex, name, value)
    return ex


def _keep(ex: Exchange, *presets: str, **config: Any) -> Exchange:
    rules = parse_rules([{"preset": p} for p in presets], ConfigError)
    Keep(replace(Config(), redact=rules, **config))(ex)
    return ex


def test_json_is_redacted_after_parsing_and_its_stored_text_agrees() -> None:
    # "\u0040" is "@": a byte-level pass over the body would miss this address.
    body = b'{"messages":[{"role":"user","content":"to jane\\u0040example.org"}],"a@b.io":1}'
    ex = _keep(_exchange(request_body=body, request_json=orjson.loads(body)), "email")
    assert ex.request_json == {
        "messages": [{"role": "user", "content": "to [REDACTED:email]"}],
        "[REDACTED:email]": 1,
    }
    assert ex.request_body is not None and orjson.loads(ex.request_body) == ex.request_json
    assert ex.redacted == {"rules": ["email"]}


def test_a_json_string_holding_json_is_walked_too() -> None:
    arguments = '{"to": "jane\\u0040example.org", "n": 1}'  # tool-call arguments, escaped
    hits: Hits = set()
    out = ALL.text(arguments, hits)
    assert orjson.loads(out) == {"to": "[REDACTED:email]", "n": 1} and hits == {"email"}


def test_a_json_number_is_redacted_as_its_text() -> None:
    arguments = orjson.dumps({"card": 4111111111111111, "n": 7}).decode()  # tool-call args
    body = {"card": 4111111111111111, "f": 4111111111111111.0, "ok": True, "args": arguments}
    ex = _keep(_exchange(request_json=body, request_body=orjson.dumps(body)), "card")
    assert ex.request_json == {
        "card": "[REDACTED:card]",
        "f": "[REDACTED:card].0",
        "ok": True,
        "args": '{"card":"[REDACTED:card]","n":7}',
    }
    assert ex.request_body is not None and orjson.loads(ex.request_body) == ex.request_json


def test_any_depth_is_walked_without_recursion() -> None:
    deep: Any = "sk-abcdefghijklmnopqrstuvwx01"
    for _ in range(5000):
        deep = [deep]
    hits: Hits = set()
    ALL.walk(deep, hits)
    for _ in range(5000):
        deep = deep[0]
    assert deep == "[REDACTED:api_key]" and hits == {"api_key"}


def test_a_raw_body_is_redacted_as_text_its_other_bytes_kept() -> None:
    body = b"--b\r\nContent-Disposition: form-data\r\n\r\nmail a@b.io\xff\xfe\r\n--b--\r\n"
    ex = _keep(_exchange(request_body=body), "email")
    assert ex.request_body == body.replace(b"a@b.io", b"[REDACTED:email]")


def test_an_answer_that_matched_keeps_neither_its_raw_stream_nor_its_logprobs() -> None:
    token = {"token": "jane@", "logprob": -1.0, "bytes": [106], "top_logprobs": []}
    choice = {"index": 0, "message": {"content": "mail jane@example.org"}}
    response = {
        "object": "chat.completion",
        "choices": [{**choice, "logprobs": {"content": [token]}}],
    }
    raw = gzip.compress(b'data: {"x": "jane@"}\n\ndata: {"x": "example.org"}\n\n')
    ex = _keep(
        _exchange(response_json=response, raw_stream_gz=raw, raw_pacing=[(0, 1.0)], stream=True),
        "email",
    )
    assert ex.response_json["choices"][0]["message"]["content"] == "mail [REDACTED:email]"
    assert ex.response_json["choices"][0]["logprobs"] is None
    assert ex.raw_stream_gz is None and ex.raw_pacing is None
    assert ex.redacted == {"rules": ["email"], "dropped": ["raw_stream", "logprobs"]}


def test_a_raw_stream_that_matches_on_its_own_is_dropped() -> None:
    raw = gzip.compress(b'data: {"obfuscation": "sk-abcdefghijklmnopqrstuvwx01"}\n\n')
    ex = _keep(_exchange(response_json={"choices": []}, raw_stream_gz=raw), "api_key")
    assert ex.raw_stream_gz is None
    assert ex.redacted == {"rules": ["api_key"], "dropped": ["raw_stream"]}


def test_the_rest_of_the_record_is_redacted() -> None:
    ex = _keep(
        _exchange(
            query="contact=a@b.io&key=***",
            path="/v1/users/a@b.io",
            user="a@b.io",
            error="upstream said: bad key sk-abcdefghijklmnopqrstuvwx01",
            parse_errors=["event 2: data is not JSON: b'a@b.io'"],
            tags={"owner": "a@b.io"},
            model="ft:a@b.io",
            response_model="ft:a@b.io",
            system_fingerprint="fp a@b.io",
            upstream_request_id="req a@b.io",
            content_type="text/plain; a@b.io",
            upstream_url="https://a@b.io/v1",
        ),
        "email",
        "api_key",
        pseudonym_key="test-key",
    )
    assert ex.query == "contact=[REDACTED:email]&key=***"
    # The user, an identifier, gets its pseudonym: HMAC-SHA256("test-key", "a@b.io")[:12].
    assert ex.path == "/v1/users/[REDACTED:email]" and ex.user == "[email:3b100af09a1f]"
    assert ex.error == "upstream said: bad key [REDACTED:api_key]"
    assert ex.parse_errors == ["event 2: data is not JSON: b'[REDACTED:email]'"]
    assert ex.tags == {"owner": "[REDACTED:email]"}
    chosen = (ex.model, ex.response_model, ex.system_fingerprint, ex.upstream_request_id)
    assert chosen == ("ft:[REDACTED:email]",) * 2 + ("fp [REDACTED:email]", "req [REDACTED:email]")
    assert ex.content_type == "text/plain; [REDACTED:email]"
    assert ex.upstream_url == "https://[REDACTED:email]/v1"
    assert ex.redacted == {"rules": ["api_key", "email"]}


def test_an_exported_record_has_what_the_client_or_upstream_chose_redacted() -> None:
    record: dict[str, Any] = {name: "x a@b.io" for name in keep.TEXTS}
    record |= {"request": None, "response": None, "raw_stream": None, "redacted": None}
    keep.redact_record(ALL, record)
    for name in ("model", "response_model", "system_fingerprint", "upstream_request_id"):
        assert record[name] == "x [REDACTED:email]"
    assert record["content_type"] == "x [REDACTED:email]"
    assert record["redacted"] == {"rules": ["email"]}


def test_a_failed_redaction_keeps_the_record_but_nothing_it_may_hold(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(redactor: Redactor, ex: Exchange) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(keep, "redact_exchange", broken)
    fields = {"request_json": {"a": "a@b.io"}, "request_body": b'{"a":"a@b.io"}'}
    fields |= {"user": "a@b.io", "query": "q=a@b.io", "error": "a@b.io", "tags": {"t": "a@b.io"}}
    fields |= {"model": "ft:a@b.io", "response_model": "ft:a@b.io", "path": "/v1/a@b.io"}
    fields |= {"upstream_url": "https://a@b.io", "system_fingerprint": "a@b.io"}
    fields |= {"upstream_request_id": "a@b.io", "content_type": "text/a@b.io"}
    ex = _keep(_exchange(**fields), "email")
    kept = (ex.request_json, ex.request_body, ex.user, ex.query, ex.error)
    assert kept == (None, None, None, "", None)
    chosen = (ex.model, ex.response_model, ex.system_fingerprint, ex.upstream_request_id)
    assert chosen == (None,) * 4 and ex.content_type is None and ex.upstream_url == ""
    assert ex.path == "[REDACTION FAILED]"
    assert ex.tags == {} and ex.omit_request and ex.omit_response
    assert ex.redacted == {"rules": [], "failed": True}
    assert "redaction failed" in caplog.text


def test_metadata_keeps_no_body_and_no_span_content() -> None:
    request = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    response = {"model": "gpt-4o-mini", "choices": [{"message": {"content": "yo"}}]}
    ex = _exchange(
        request_json=request,
        request_body=orjson.dumps(request),
        response_json=response,
        response_body=orjson.dumps(response),
        model="gpt-4o-mini",
        usage={"prompt_tokens": 1000, "completion_tokens": 1000},
    )
    config = replace(Config(), store_bodies="metadata", otlp_content=True)
    settle(ex, dbs.PRICES)  # as Sinks.accept does, before Keep
    Keep(config)(ex)
    assert (ex.request_json, ex.request_body, ex.response_json, ex.response_body) == (None,) * 4
    assert ex.omit_request and ex.omit_response
    attributes = {a.key: a.value for a in SpanBuilder(config).span(ex).attributes}
    assert "gen_ai.input.messages" not in attributes
    assert "gen_ai.output.messages" not in attributes
    assert attributes["flightrec.cost_usd"].double_value > 0


async def test_metadata_through_the_proxy_stores_no_body_and_the_same_cost(
    tmp_path: Path, db_url: str
) -> None:
    async with fake_upstream() as upstream:
        answer_by_model(upstream)
        full = dbs.sqlite_url(tmp_path / "full.db")
        await record_two(config_for(full, upstream.url, tmp_path / "full"))
        await record_two(config_for(db_url, upstream.url, tmp_path, store_bodies="metadata"))
    costs = []
    for url in (full, db_url):
        engine = create_engine(url)
        async with engine.connect() as conn:
            query = "SELECT stream, cost_usd, model FROM exchanges ORDER BY stream"
            costs.append((await conn.execute(sa.text(query))).all())
            if url == db_url:
                bodies = "SELECT request, request_body, response, response_body FROM exchanges"
                assert (await conn.execute(sa.text(bodies))).all() == [(None,) * 4] * 2
                for table in ("choices", "logprobs", "raw_streams", "completions"):
                    count = (await conn.execute(sa.text(f"SELECT count(*) FROM {table}"))).scalar()
                    assert count == 0, table
                usage = "SELECT count(*) FROM usage WHERE total_tokens > 0"
                assert (await conn.execute(sa.text(usage))).scalar() == 2
        await engine.dispose()
    assert costs[0] == costs[1] and all(cost for _, cost, _ in costs[1])
    assert len(costs[1]) == 2


PIECES = [
    "jane@example.org",
    "4111 1111 1111 1111",
    "4111111111111112",
    "555-123-4567",
    "+44 20 7946 0958",
    "sk-abcdefghijklmnopqrstuvwx01",
    "Bearer abcdefghijklmnop",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIE",
    "\n-----END RSA PRIVATE KEY-----",
    '"',
    "\\",
    "\n",
    "\x01",
    "{",
    "[",
    ".",
    "a",
    "7",
    " ",
    "4111111111111111",
    "é",
]


def _naive(value: Any, hits: Hits) -> Any:
    """Every string searched by every rule on its own: what the whole-value search must equal."""
    if isinstance(value, str):
        return ALL.text(value, hits)
    if isinstance(value, int | float) and not isinstance(value, bool):
        text = str(value)
        out = ALL.text(text, hits)
        return value if out == text else out
    if isinstance(value, list):
        return [_naive(item, hits) for item in value]
    if isinstance(value, dict):
        return {_naive(key, hits): _naive(item, hits) for key, item in value.items()}
    return value


texts = st.lists(st.sampled_from(PIECES), max_size=6).map("".join)


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4))


values = st.recursive(
    st.one_of(
        texts,
        st.integers(),
        st.sampled_from([4111111111111111, 4111111111111111.0]),
        st.floats(allow_nan=False),
        st.none(),
    ),
    _containers,
    max_leaves=12,
)


@given(st.one_of(st.lists(values, max_size=4), st.dictionaries(texts, values, max_size=4)))
def test_searching_a_value_whole_finds_what_each_string_holds(value: Any) -> None:
    expected_hits: Hits = set()
    expected = _naive(copy.deepcopy(value), expected_hits)
    hits: Hits = set()
    ALL.walk(value, hits)
    assert (value, hits) == (expected, expected_hits)
