"""exchanges.session: the session an exchange belongs to (SPEC section 8).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27

Nullable, NULL for every exchange recorded before this revision; a partial index on
(session, started_at) holds only the exchanges that have one, for the session page and the
list's session filter.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("exchanges", sa.Column("session", sa.String()))
    where = sa.text("session IS NOT NULL")
    op.create_index(
        "ix_exchanges_session_started_at",
        "exchanges",
        ["session", "started_at"],
        sqlite_where=where,
        postgresql_where=where,
    )


def downgrade() -> None:
    op.drop_index("ix_exchanges_session_started_at", table_name="exchanges")
    with op.batch_alter_table("exchanges") as batch:
        batch.drop_column("session")
