"""Initial schema: exchanges and their tags, completions, choices, usage, logprobs, raw
streams; fingerprints.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Written out in full rather than imported from `proxy.store.tables`: a migration is a frozen
record of what the schema was at this revision, and `tests/store/test_migrations.py` checks that
the tables and this file agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _exchange_id(table: str) -> list[sa.SchemaItem]:
    return [
        sa.Column("exchange_id", sa.String(36), nullable=False),
        sa.ForeignKeyConstraint(
            ["exchange_id"],
            ["exchanges.id"],
            name=f"fk_{table}_exchange_id_exchanges",
            ondelete="CASCADE",
        ),
    ]


def upgrade() -> None:
    op.create_table(
        "exchanges",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("method", sa.String(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("query", sa.Text(), nullable=False),
        sa.Column("upstream", sa.String(), nullable=False),
        sa.Column("upstream_url", sa.Text(), nullable=False),
        sa.Column("status", sa.Integer()),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("model", sa.String()),
        sa.Column("response_model", sa.String()),
        sa.Column("outcome", sa.String(), nullable=False),
        sa.Column("error", sa.Text()),
        sa.Column("request", sa.JSON()),
        sa.Column("request_body", sa.LargeBinary()),
        sa.Column("request_omitted", sa.Boolean(), nullable=False),
        sa.Column("response", sa.JSON()),
        sa.Column("response_body", sa.LargeBinary()),
        sa.Column("response_omitted", sa.Boolean(), nullable=False),
        sa.Column("response_bytes", sa.BigInteger(), nullable=False),
        sa.Column("content_type", sa.String()),
        sa.Column("ttfb_ms", sa.Double()),
        sa.Column("ttft_ms", sa.Double()),
        sa.Column("duration_ms", sa.Double()),
        sa.Column("chunks", sa.Integer(), nullable=False),
        sa.Column("upstream_request_id", sa.String()),
        sa.Column("key_hash", sa.String()),
        sa.Column("key_hint", sa.String()),
        sa.Column("end_user", sa.String()),
        sa.Column("replay_of", sa.String(36)),
        sa.Column("usage_source", sa.String()),
        sa.Column("system_fingerprint", sa.String()),
        sa.Column("parse_errors", sa.JSON()),
        sa.Column("cost_usd", sa.Double()),
        sa.Column("price_entry", sa.String()),
        sa.PrimaryKeyConstraint("id", name="pk_exchanges"),
    )
    for columns in (
        ["started_at"],
        ["model", "started_at"],
        ["key_hash", "started_at"],
        ["end_user", "started_at"],
        ["upstream", "started_at"],
        ["replay_of"],
    ):
        op.create_index(f"ix_exchanges_{'_'.join(columns)}", "exchanges", columns)

    op.create_table(
        "tags",
        *_exchange_id("tags"),
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("value", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("exchange_id", "key", name="pk_tags"),
    )
    op.create_index("ix_tags_key_value", "tags", ["key", "value"])

    op.create_table(
        "completions",
        *_exchange_id("completions"),
        sa.Column("completion_id", sa.String()),
        sa.Column("object", sa.String()),
        sa.Column("created", sa.BigInteger()),
        sa.Column("model", sa.String()),
        sa.Column("system_fingerprint", sa.String()),
        sa.Column("service_tier", sa.String()),
        sa.PrimaryKeyConstraint("exchange_id", name="pk_completions"),
    )
    op.create_table(
        "choices",
        *_exchange_id("choices"),
        sa.Column("choice_index", sa.Integer(), nullable=False),
        sa.Column("role", sa.String()),
        sa.Column("content", sa.Text()),
        sa.Column("refusal", sa.Text()),
        sa.Column("finish_reason", sa.String()),
        sa.Column("tool_calls", sa.JSON()),
        sa.Column("function_call", sa.JSON()),
        sa.Column("audio", sa.JSON()),
        sa.PrimaryKeyConstraint("exchange_id", "choice_index", name="pk_choices"),
    )
    op.create_table(
        "usage",
        *_exchange_id("usage"),
        sa.Column("prompt_tokens", sa.Integer()),
        sa.Column("completion_tokens", sa.Integer()),
        sa.Column("total_tokens", sa.Integer()),
        sa.Column("cached_tokens", sa.Integer()),
        sa.Column("prompt_audio_tokens", sa.Integer()),
        sa.Column("reasoning_tokens", sa.Integer()),
        sa.Column("completion_audio_tokens", sa.Integer()),
        sa.Column("accepted_prediction_tokens", sa.Integer()),
        sa.Column("rejected_prediction_tokens", sa.Integer()),
        sa.Column("raw", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("exchange_id", name="pk_usage"),
    )
    op.create_table(
        "logprobs",
        *_exchange_id("logprobs"),
        sa.Column("choice_index", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("token", sa.Text(), nullable=False),
        sa.Column("logprob", sa.Double()),
        sa.Column("bytes", sa.JSON()),
        sa.Column("top_logprobs", sa.JSON()),
        sa.PrimaryKeyConstraint(
            "exchange_id", "choice_index", "kind", "position", name="pk_logprobs"
        ),
    )
    op.create_table(
        "raw_streams",
        *_exchange_id("raw_streams"),
        sa.Column("gz", sa.LargeBinary(), nullable=False),
        sa.Column("pacing", sa.JSON()),
        sa.PrimaryKeyConstraint("exchange_id", name="pk_raw_streams"),
    )
    op.create_table(
        "fingerprints",
        sa.Column("upstream", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("system_fingerprint", sa.String(), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("upstream", "model", "system_fingerprint", name="pk_fingerprints"),
    )


def downgrade() -> None:
    for table in (
        "fingerprints",
        "raw_streams",
        "logprobs",
        "usage",
        "choices",
        "completions",
        "tags",
    ):
        op.drop_table(table)
    op.drop_table("exchanges")
