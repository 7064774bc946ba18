"""Exchange ids: UUIDv7, time-ordered, unique."""

from __future__ import annotations

import time
import uuid

from proxy.exchange import new_id


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
