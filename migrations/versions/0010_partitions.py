"""PostgreSQL: `exchanges` and its child tables partitioned by day (`store/partitions.py`).

Revision ID: 0010
Revises: 0011
Create Date: 2026-11-27

Each of the seven tables is rebuilt, parents first: its keys and indexes are read from the
catalog, the table is renamed aside (`<table>_old`, its indexes too), created again as a
RANGE-partitioned table (on `id`, on `exchange_id` in the children) with the same columns,
keys and indexes, given a DEFAULT partition and a partition per day from the oldest stored
id's day to `AHEAD_DAYS` after today, filled from the old table, which is then dropped. The
rows are copied, so the upgrade takes about as long as writing them again. Downgrade rebuilds
plain tables the same way. SQLite: nothing changes. A table of another migration that refers
to one of these seven would make the old table's DROP fail, not lose its key silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta

import sqlalchemy as sa
from alembic import op

from proxy.store import partitions

revision: str = "0010"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = (partitions.PARENT, *partitions.CHILDREN)
"""Parents first."""
OLDEST = timedelta(days=3650)
"""Days further back than this (an id that only looks like a UUIDv7) get no partition."""


def _key(table: str) -> str:
    return "id" if table == partitions.PARENT else "exchange_id"


def _definitions(conn: sa.Connection, table: str) -> tuple[list[tuple[str, str]], list[str]]:
    """(name, definition) of the table's primary and foreign keys, and the CREATE INDEX
    statements of its other indexes, as the catalog has them now."""
    keys = conn.execute(
        sa.text(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conrelid = to_regclass(:t) AND contype IN ('p', 'f', 'u') "
            # Not the copies PostgreSQL makes of a key for each partition it refers to.
            "AND conparentid = 0 "
            "ORDER BY contype = 'f', conname"
        ),
        {"t": table},
    ).all()
    indexes = conn.execute(
        sa.text(
            "SELECT indexdef FROM pg_indexes WHERE schemaname = current_schema() "
            "AND tablename = :t AND indexname NOT IN "
            "(SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(:t)) "
            "ORDER BY indexname"
        ),
        {"t": table},
    ).scalars()
    return [(str(n), str(d)) for n, d in keys], [str(i) for i in indexes]


def _index_names(conn: sa.Connection, table: str) -> list[str]:
    found = conn.execute(
        sa.text(
            "SELECT indexname FROM pg_indexes "
            "WHERE schemaname = current_schema() AND tablename = :t"
        ),
        {"t": table},
    )
    return [str(n) for n in found.scalars()]


def _rebuild(partitioned: bool) -> None:
    conn = op.get_bind()
    found = {table: _definitions(conn, table) for table in TABLES}
    for table in reversed(TABLES):
        for index in _index_names(conn, table):
            op.execute(f'ALTER INDEX "{index}" RENAME TO "{index}_old"')
        op.execute(f'ALTER TABLE "{table}" RENAME TO "{table}_old"')
    for table in TABLES:
        split = f" PARTITION BY RANGE ({_key(table)})" if partitioned else ""
        op.execute(f'CREATE TABLE "{table}" (LIKE "{table}_old" INCLUDING DEFAULTS){split}')
        keys, indexes = found[table]
        for name, definition in keys:
            op.execute(f'ALTER TABLE "{table}" ADD CONSTRAINT "{name}" {definition}')
        for statement in indexes:
            op.execute(statement)
    if partitioned:
        partitions.create_default(conn)
        partitions.create_days(conn, _days(conn))
    for table in TABLES:
        op.execute(f'INSERT INTO "{table}" SELECT * FROM "{table}_old"')
    for table in reversed(TABLES):
        op.execute(f'DROP TABLE "{table}_old"')


def _days(conn: sa.Connection) -> list[date]:
    """Each day from the oldest stored exchange's to `AHEAD_DAYS` after today."""
    today = datetime.now(UTC).date()
    oldest = conn.execute(sa.text('SELECT min(id) FROM "exchanges_old"')).scalar()
    first = partitions.day_of(oldest) if isinstance(oldest, str) else None
    if first is None or not today - OLDEST <= first <= today:
        first = today
    span = (today - first).days + partitions.AHEAD_DAYS
    return [first + timedelta(days=n) for n in range(span + 1)]


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _rebuild(partitioned=True)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        _rebuild(partitioned=False)
