"""Leaner exchange indexes: no `(upstream, started_at)`; `(end_user, started_at)` and
`(replay_of)` hold only the rows that have a user, or are replays.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

Every index on `exchanges` is written for every record, on the proxy's own CPU with SQLite.
No query of flightrec's filters by upstream, and a handful of upstreams hold every row, so
that index could not narrow a search; most records have no user and are not replays, and a
partial index still serves `end_user = ...` and `replay_of = ...`. Together: ~5 us less per
record on SQLite (bench/).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PARTIAL = (("end_user", "started_at"), ("replay_of",))


def _create(columns: tuple[str, ...], where: str | None) -> None:
    partial = (
        {}
        if where is None
        else {
            "sqlite_where": sa.text(where),
            "postgresql_where": sa.text(where),
        }
    )
    op.create_index(f"ix_exchanges_{'_'.join(columns)}", "exchanges", list(columns), **partial)


def upgrade() -> None:
    op.drop_index("ix_exchanges_upstream_started_at", table_name="exchanges")
    for columns in _PARTIAL:
        op.drop_index(f"ix_exchanges_{'_'.join(columns)}", table_name="exchanges")
        _create(columns, f"{columns[0]} IS NOT NULL")


def downgrade() -> None:
    for columns in _PARTIAL:
        op.drop_index(f"ix_exchanges_{'_'.join(columns)}", table_name="exchanges")
        _create(columns, None)
    _create(("upstream", "started_at"), None)
