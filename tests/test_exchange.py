"""Exchange ids: UUIDv7, time-ordered, unique."""

from __future__ import annotations

import time
import uuid

from proxy.exchange import format_id, id_place, new_id


def test_ids_are_uuid7_strictly_increasing_and_unique() -> None:
    before = time.time_ns() // 1_000_000
    ids = [new_id() for _ in range(20_000)]  # many per millisecond: the counter must carry
    after = time.time_ns() // 1_000_000
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    for text in (ids[0], ids[-1]):
        parsed = uuid.UUID(text)
        assert str(parsed) == text
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
    first_ms = int(ids[0].replace("-", "")[:12], 16)
    assert before <= first_ms <= after + 1


def test_an_id_sorts_by_when_its_place_was_taken_not_when_it_was_formatted() -> None:
    places = [id_place() for _ in range(3000)]  # several milliseconds' worth
    ids = [format_id(place) for place in reversed(places)][::-1]  # formatted last to first
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert all(uuid.UUID(value).version == 7 for value in ids)
    assert new_id() > ids[-1]
