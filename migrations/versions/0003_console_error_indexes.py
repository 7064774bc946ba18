"""Partial indexes for the console's error filters: `(outcome, started_at)` over the exchanges
that did not end `ok`, and `(status, started_at)` over those with an HTTP status >= 400.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24

Failures are rare and are what people look for (`outcome=timeout`, `status=500`): without an
index a filter on a value no recent row has reads the whole table (bench/bench_console.py).
Partial, so a successful exchange (nearly all of them) writes neither index; the list query
repeats the index's condition when it filters on a failure, which SQLite needs to use it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = {
    "ix_exchanges_outcome_started_at": (("outcome", "started_at"), "outcome <> 'ok'"),
    "ix_exchanges_status_started_at": (("status", "started_at"), "status >= 400"),
}


def upgrade() -> None:
    for name, (columns, where) in INDEXES.items():
        partial = {"sqlite_where": sa.text(where), "postgresql_where": sa.text(where)}
        op.create_index(name, "exchanges", list(columns), **partial)


def downgrade() -> None:
    for name in INDEXES:
        op.drop_index(name, table_name="exchanges")
