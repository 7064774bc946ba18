"""Cost truth: the service tier an exchange was priced at, and every token class of its usage.

Revision ID: 0007
Revises: 0008
Create Date: 2026-11-27

`exchanges.service_tier` is the tier the response reported (`flex`, `priority`, ...), which
chooses the price; `flightrec cost --reprice` needs it. `exchanges.price_entry` keeps its
name and now says where the price came from (`genai-prices 0.2.3 openai/gpt-5 flex`, or
`config <model>`). The new `usage` columns hold the classes genai-prices prices apart: cache
writes, cached audio and image input, image input and output. All nullable, NULL for rows
written before: adding them rewrites no row on either engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_USAGE = (
    "cache_write_tokens",
    "cached_audio_tokens",
    "prompt_image_tokens",
    "cached_image_tokens",
    "completion_image_tokens",
)


def upgrade() -> None:
    op.add_column("exchanges", sa.Column("service_tier", sa.String()))
    for name in _USAGE:
        op.add_column("usage", sa.Column(name, sa.Integer()))


def downgrade() -> None:
    # SQLite (3.35+) drops a column in place: no copy of the table, its indexes untouched.
    for name in reversed(_USAGE):
        op.drop_column("usage", name)
    op.drop_column("exchanges", "service_tier")
