"""Which exchanges a command covers: one set of filters for `cost`, `logs`, `replay`, `export`
and the console, turned into SQL conditions in one place."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from proxy.store import tables as t


@dataclass(frozen=True, slots=True)
class Filters:
    """Every given filter must match."""

    since: datetime | None = None
    """Exchanges started at or after this (UTC-aware)."""
    until: datetime | None = None
    """Exchanges started before this."""
    model: str | None = None
    """The requested or the answering model, exactly (`cost --model`, the console)."""
    key: str | None = None
    """The key's hint (`sk-...a1b2`) or its hash, or a prefix of the hash."""
    tags: tuple[tuple[str, str], ...] = ()
    user: str | None = None
    """The end user, exactly (alerts and budgets: `user = ...`, `scope = "user:..."`)."""
    upstream: str | None = None
    """The upstream's name, exactly."""
    requested_model: str | None = None
    """The model the client requested, exactly (`export --model`, `replay --from-model`)."""
    originals_only: bool = False
    """Leave out exchanges that are replays themselves."""
    also: tuple[sa.ColumnElement[bool], ...] = ()
    """More conditions, e.g. the console's list filters (`browse.ListFilters.where`)."""
    limit: int | None = None
    """At most this many, the newest (`scan.select_ids`, `scan.stream_records`)."""

    def where(self) -> list[sa.ColumnElement[bool]]:
        ex = t.exchanges
        found = list(self.also)
        if self.requested_model is not None:
            found.append(ex.c.model == self.requested_model)
        if self.originals_only:
            found.append(ex.c.replay_of.is_(None))

        def tagged(key: str, value: str) -> sa.ColumnElement[bool]:
            tags = t.tags
            return sa.exists().where(
                tags.c.exchange_id == ex.c.id, tags.c.key == key, tags.c.value == value
            )

        return found + self.report_where(ex.c.started_at, ex, tagged)

    def report_where(
        self,
        time: sa.ColumnElement[Any],
        table: sa.Table,
        tagged: Callable[[str, str], sa.ColumnElement[bool]],
    ) -> list[sa.ColumnElement[bool]]:
        """The filters the cost report has, on `table` (exchanges or rollups: the same
        `model`, `response_model`, `key_hint`, `key_hash`, `end_user` and `upstream` columns)
        with its `time`;
        `tagged(k, v)` says a row has tag k=v."""
        found = []
        if self.since is not None:
            found.append(time >= self.since)
        if self.until is not None:
            found.append(time < self.until)
        if self.model is not None:
            found.append(sa.or_(table.c.model == self.model, table.c.response_model == self.model))
        if self.key is not None:
            found.append(
                sa.or_(
                    table.c.key_hint == self.key,
                    table.c.key_hash.startswith(self.key.lower(), autoescape=True),
                )
            )
        if self.user is not None:
            found.append(table.c.end_user == self.user)
        if self.upstream is not None:
            found.append(table.c.upstream == self.upstream)
        found += [tagged(key, value) for key, value in self.tags]
        return found
