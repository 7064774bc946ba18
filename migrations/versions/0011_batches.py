"""The Batch API's files and batches as they passed through the proxy (SPEC 12).

Revision ID: 0011
Revises: 0007
Create Date: 2026-11-27

`batch_requests`: the lines of uploaded batch input files; `batches`: each batch as last seen;
`batch_results`: one row per result line booked, keyed by the line's own id, so a result is
booked once however often and by whichever process its file is downloaded. New tables only:
no existing row is touched.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TIME = sa.DateTime(timezone=True)
_JSON = sa.JSON(none_as_null=True)


def upgrade() -> None:
    op.create_table(
        "batch_requests",
        sa.Column("input_file_id", sa.String(), nullable=False),
        sa.Column("custom_id", sa.String(), nullable=False),
        sa.Column("line", sa.Integer(), nullable=False),
        sa.Column("method", sa.String()),
        sa.Column("url", sa.String()),
        sa.Column("model", sa.String()),
        sa.Column("body", _JSON),
        sa.Column("exchange_id", sa.String(36), nullable=False),
        sa.PrimaryKeyConstraint("input_file_id", "custom_id", name="pk_batch_requests"),
    )
    op.create_table(
        "batches",
        sa.Column("id", sa.String(), nullable=False),
        sa.Column("status", sa.String()),
        sa.Column("endpoint", sa.String()),
        sa.Column("input_file_id", sa.String()),
        sa.Column("output_file_id", sa.String()),
        sa.Column("error_file_id", sa.String()),
        sa.Column("created_at", _TIME),
        sa.Column("seen_at", _TIME, nullable=False),
        sa.Column("request_counts", _JSON),
        sa.Column("exchange_id", sa.String(36), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_batches"),
    )
    for column in ("input_file_id", "output_file_id", "error_file_id"):
        op.create_index(f"ix_batches_{column}", "batches", [column])
    op.create_table(
        "batch_results",
        sa.Column("line_id", sa.String(), nullable=False),
        sa.Column("file_id", sa.String(), nullable=False),
        sa.Column("batch_id", sa.String()),
        sa.Column("custom_id", sa.String()),
        sa.Column("exchange_id", sa.String(36), nullable=False),
        sa.Column("booked_at", _TIME, nullable=False),
        sa.PrimaryKeyConstraint("line_id", name="pk_batch_results"),
    )
    op.create_index("ix_batch_results_file_id", "batch_results", ["file_id"])
    op.create_index(
        "ix_batch_results_batch_id_custom_id", "batch_results", ["batch_id", "custom_id"]
    )
    op.create_index("ix_batch_results_exchange_id", "batch_results", ["exchange_id"])


def downgrade() -> None:
    op.drop_table("batch_results")
    op.drop_table("batches")
    op.drop_table("batch_requests")
