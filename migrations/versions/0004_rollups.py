"""Daily rollups: the usage and cost of pruned exchanges (`flightrec prune`, retention).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24

One `rollups` row per UTC day and group (upstream, requested and answering model, key, user,
tag set) with the sums the cost report needs, and its tags in `rollup_tags`, shaped like
`tags`, so the report reads pruned and kept exchanges with the same groups and filters.
`rollup_tags.rollup_id` has no foreign key: only `prune` writes these tables, and the check
cost a scan of `rollups` per row on PostgreSQL (its plan was made when the table was empty).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SUMS = (
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cost_nano",
    "priced",
    "unpriced",
)


def upgrade() -> None:
    op.create_table(
        "rollups",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("day", sa.DateTime(timezone=True), nullable=False),
        sa.Column("upstream", sa.String(), nullable=False),
        sa.Column("model", sa.String()),
        sa.Column("response_model", sa.String()),
        sa.Column("key_hash", sa.String()),
        sa.Column("key_hint", sa.String()),
        sa.Column("end_user", sa.String()),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in SUMS),
        sa.PrimaryKeyConstraint("id", name="pk_rollups"),
    )
    op.create_index("ix_rollups_day", "rollups", ["day"])
    op.create_table(
        "rollup_tags",
        sa.Column("rollup_id", sa.String(32), nullable=False),
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("value", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("rollup_id", "key", name="pk_rollup_tags"),
    )
    op.create_index("ix_rollup_tags_key_value", "rollup_tags", ["key", "value"])


def downgrade() -> None:
    op.drop_table("rollup_tags")
    op.drop_table("rollups")
