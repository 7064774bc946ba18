"""`facets.of_batch`, which sums a batch by groups of exchanges that share their facet rows,
against `facets.add` taking the same exchanges one by one (what migration 0008 and the
reading side's rules are written against)."""

from __future__ import annotations

import random
from typing import Any

from proxy.pricing import Prices
from proxy.sinks.settle import settle
from proxy.store import facets
from proxy.store import tables as t
from proxy.store.rows import Rows, exchange_fields, named, rows_for
from tests.dbs import chat_exchange

HOUR = 3600.0


def _one_by_one(batch: list[Rows]) -> list[list[Any]]:
    into: dict[facets.FacetKey, list[Any]] = {}
    for rows in batch:
        usage = named(t.usage, rows.usage[0]) if rows.usage else None
        tags = [(tag[1], tag[2]) for tag in rows.tags]
        facets.add(into, exchange_fields(rows.exchange), usage, tags)
    return [into[key] for key in sorted(into)]


def _varied(rng: random.Random, count: int) -> list[Rows]:
    """Exchanges that share some facets and not others, some hints named late, hours and a
    midnight crossed, and every kind of sum: errors, unpriced, free, no usage, odd latencies."""
    prices = Prices()
    batch = []
    for i in range(count):
        ex = chat_exchange(
            model=rng.choice(["gpt-4o-mini", "gpt-4o", "unknown-model"]),
            started_at=1_722_988_800.0 - 2 * HOUR + i * rng.choice([1.0, 97.0, 900.0]),
        )
        ex.upstream = rng.choice(["openai", "other", ""])
        ex.key_hash, ex.key_hint = rng.choice(
            [(None, None), ("k1", None), ("k1", "sk-...1"), ("k2", "sk-...2"), ("k2", None)]
        )
        ex.user = rng.choice([None, None, "alice", ""])
        ex.tags = rng.choice([{}, {}, {"team": "a"}, {"team": "b", "env": "prod"}])
        ex.outcome = rng.choice(["ok", "ok", "ok", "upstream_error", "timeout"])
        ex.status = rng.choice([200, 200, 400, 500, None])
        ex.path = rng.choice(["/v1/chat/completions", "/v1/moderations"])
        ex.duration_ms = rng.choice([None, 0.0, 12.5, 900.0, 1e9, float("nan"), float("inf")])
        ex.ttft_ms = rng.choice([None, 30.0, 400.0])
        if rng.random() < 0.2:
            ex.usage = None
            ex.response_json.pop("usage")
            ex.usage_source = rng.choice([None, "missing"])
        settle(ex, prices)
        if rng.random() < 0.2:
            ex.cost_usd, ex.price_entry = rng.choice([0.0, 1e-12, 2.5]), "set by hand"
        if rng.random() < 0.1:
            ex.response_model = None
            ex.response_json.pop("model")
        batch.append(rows_for(ex))
    return batch


def test_a_batch_sums_to_what_its_exchanges_add_one_by_one() -> None:
    rng = random.Random(36)
    for count in (1, 2, 7, 60, 300):
        batch = _varied(rng, count)
        assert facets.of_batch(batch) == _one_by_one(batch)


def test_a_row_keeps_the_first_hint_its_exchanges_name() -> None:
    prices = Prices()
    batch = []
    for hint in (None, "sk-...first", None, "sk-...second"):
        ex = chat_exchange()
        ex.key_hash, ex.key_hint = "k1", hint
        settle(ex, prices)
        batch.append(rows_for(ex))
    found = {(row[0], row[1]): row for row in facets.of_batch(batch) if row[0] == "key"}
    assert {key: row[4] for key, row in found.items()} == {
        ("key", "hour"): "sk-...first",
        ("key", "day"): "sk-...first",
    }
    assert all(row[facets.SUM_AT] == 4 for row in found.values())
    assert facets.of_batch(batch) == _one_by_one(batch)
