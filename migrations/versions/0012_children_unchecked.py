"""PostgreSQL: the child tables no longer carry a foreign key to `exchanges`.

Revision ID: 0012
Revises: 0010
Create Date: 2026-11-27

Each row of `tags`, `completions`, `choices`, `usage`, `logprobs` and `raw_streams` made the
server look its exchange up and lock it (a trigger per row), through the partitioned
`exchanges`: three quarters of the server's time for an exchange with 100 logprob tokens, over
half for a plain one (docs/performance.md, *Recording throughput*). Nothing needs the check:
the writer inserts children only with their exchange, in the same transaction, and retention
deletes the children itself (`store.prune`) or drops their partitions first
(`store.partitions`). Deleting an exchange by hand no longer deletes its rows: delete them
first, as `prune` does. SQLite keeps its keys (the writer's check costs little there, and
dropping one rebuilds the table).
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHILDREN = ("tags", "completions", "choices", "usage", "logprobs", "raw_streams")


def _name(table: str) -> str:
    return f"fk_{table}_exchange_id_exchanges"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in CHILDREN:
        op.execute(f'ALTER TABLE "{table}" DROP CONSTRAINT IF EXISTS "{_name(table)}"')


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in CHILDREN:
        op.execute(
            f'ALTER TABLE "{table}" ADD CONSTRAINT "{_name(table)}" FOREIGN KEY (exchange_id) '
            "REFERENCES exchanges (id) ON DELETE CASCADE"
        )
