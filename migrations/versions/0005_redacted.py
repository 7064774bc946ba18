"""`exchanges.redacted`: which `[[redact]]` rules matched an exchange, and what of it was not
kept because a match could not be redacted in it faithfully (a stream's raw bytes, logprobs).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24

Nullable JSON, NULL for every exchange no rule matched (all of them before this revision):
adding it rewrites no row on either engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("exchanges", sa.Column("redacted", sa.JSON(none_as_null=True)))


def downgrade() -> None:
    # SQLite (3.35+) drops a column in place: no copy of the table, its indexes untouched.
    op.drop_column("exchanges", "redacted")
