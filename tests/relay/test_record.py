"""`Record` makes its `Exchange` positionally: the same exchange the named call makes."""

from __future__ import annotations

from proxy.config import Upstream
from proxy.exchange import Exchange, id_place
from proxy.relay.record import Record
from proxy.relay.usage_option import upstream_body


def test_the_exchange_made_is_the_one_named_fields_make() -> None:
    upstream = Upstream("openai", "http://upstream.test/v1", "/v1")
    record = Record(id_place(), "POST", upstream, "/chat/completions?x=1", 1_700_000_000.5)
    record.body = upstream_body(b'{"model":"m","stream":true}', inject=True)
    made = record.ensure_exchange()
    assert made == Exchange(
        id=record.id,
        started_at=1_700_000_000.5,
        method="POST",
        path="",
        query="",
        upstream="openai",
        upstream_url="http://upstream.test/v1/chat/completions",
        request_body=b'{"model":"m","stream":true}',
        request_json={"model": "m", "stream": True},
    )
    assert made.status is None and made.stream is False and made.model is None


def test_without_a_body_read_the_exchange_has_none() -> None:
    upstream = Upstream("openai", "http://upstream.test/v1", "/v1")
    made = Record(id_place(), "GET", upstream, "/models", 1.0).ensure_exchange()
    assert made.request_body is None and made.request_json is None
    assert made.upstream_url == "http://upstream.test/v1/models"
