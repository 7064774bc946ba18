"""The overview's running sums (`facets`, per UTC hour and day, facet and value), and the keys
that link a chat's or a Responses chain's turns into a session (`exchanges.turn_key`,
`parent_key`).

Revision ID: 0008
Revises: 0009
Create Date: 2026-11-27

The writer adds each exchange it inserts to these rows (`proxy/store/facets.py`); this
migration creates the table and fills it from the exchanges already stored, so the overview
counts them too. Exchanges pruned before it are in the daily `rollups` only: the cost report
still counts them, the overview does not (docs/console.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql, sqlite

from proxy.store import facets
from proxy.store import tables as t

revision: str = "0008"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 20_000
"""Exchanges read per round of the backfill; their sums are written before the next round."""


def upgrade() -> None:
    op.create_table(
        "facets",
        sa.Column("dim", sa.String(), nullable=False),
        sa.Column("span", sa.String(4), nullable=False),
        sa.Column("start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("value", sa.String(), nullable=False),
        sa.Column("hint", sa.String()),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in t.FACET_SUMS),
        sa.PrimaryKeyConstraint("dim", "span", "start", "value", name="pk_facets"),
        sqlite_with_rowid=False,
    )
    op.create_index("ix_facets_dim_value_span_start", "facets", ["dim", "value", "span", "start"])
    op.create_index("ix_facets_top", "facets", ["dim", "span", "start", *t.FACET_TOP])
    op.add_column("exchanges", sa.Column("turn_key", sa.String()))
    op.add_column("exchanges", sa.Column("parent_key", sa.String()))
    where = sa.text("turn_key IS NOT NULL")
    op.create_index(
        "ix_exchanges_turn_key",
        "exchanges",
        ["turn_key"],
        sqlite_where=where,
        postgresql_where=where,
    )
    _backfill(op.get_bind())


def downgrade() -> None:
    op.drop_index("ix_exchanges_turn_key", table_name="exchanges")
    with op.batch_alter_table("exchanges") as batch:
        batch.drop_column("parent_key")
        batch.drop_column("turn_key")
    op.drop_index("ix_facets_top", table_name="facets")
    op.drop_index("ix_facets_dim_value_span_start", table_name="facets")
    op.drop_table("facets")


def _backfill(conn: sa.Connection) -> None:
    query = facets.exchanges_query().limit(BATCH)
    last = None
    while True:
        ex = t.exchanges
        found = conn.execute(query if last is None else query.where(ex.c.id > last)).all()
        if not found:
            return
        last = found[-1].id
        into: dict[Any, list[Any]] = {}
        tags = conn.execute(facets.tags_query([row.id for row in found])).all()
        facets.add_rows(into, found, tags)
        _save(conn, [dict(zip(facets.COLUMNS, into[key], strict=True)) for key in sorted(into)])


def _save(conn: sa.Connection, rows: list[facets.Facet]) -> None:
    insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    statement = insert(t.facets)
    added = {name: t.facets.c[name] + statement.excluded[name] for name in t.FACET_SUMS}
    added["hint"] = sa.func.coalesce(t.facets.c.hint, statement.excluded.hint)
    upsert = statement.on_conflict_do_update(index_elements=facets.KEY, set_=added)
    for start in range(0, len(rows), 1000):
        conn.execute(upsert, rows[start : start + 1000])
