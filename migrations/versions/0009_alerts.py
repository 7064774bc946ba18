"""`alert_state` and `alert_events`: where alerts and budgets stand, and their history.

Revision ID: 0009
Revises: 0006
Create Date: 2026-11-27

Two new tables; nothing else changes. A state row per (alert, group) is moved only by a
compare-and-set update, so that several proxies sharing the database fire each alert once.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Time = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "alert_state",
        sa.Column("alert", sa.String(), nullable=False),
        sa.Column("group_key", sa.String(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("value", sa.Double()),
        sa.Column("threshold", sa.Double()),
        sa.Column("detail", sa.Text()),
        sa.Column("changed_at", Time, nullable=False),
        sa.PrimaryKeyConstraint("alert", "group_key", name="pk_alert_state"),
    )
    op.create_table(
        "alert_events",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("at", Time, nullable=False),
        sa.Column("alert", sa.String(), nullable=False),
        sa.Column("group_key", sa.String(), nullable=False),
        sa.Column("state", sa.String(), nullable=False),
        sa.Column("previous", sa.String(), nullable=False),
        sa.Column("value", sa.Double()),
        sa.Column("threshold", sa.Double()),
        sa.Column("detail", sa.Text()),
        sa.PrimaryKeyConstraint("id", name="pk_alert_events"),
    )
    op.create_index("ix_alert_events_at", "alert_events", ["at"])


def downgrade() -> None:
    op.drop_index("ix_alert_events_at", table_name="alert_events")
    op.drop_table("alert_events")
    op.drop_table("alert_state")
