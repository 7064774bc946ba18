"""PostgreSQL: `exchanges` and its rows partitioned by day, so retention drops whole days.

Exchange ids are UUIDv7 strings whose text sorts as time (`proxy.exchange`), so each table is
RANGE-partitioned on the id (`exchange_id` in the child tables): the primary and foreign keys
stay as they are, and a day is the range from the id of its first millisecond to the next
day's. Every table has the same daily partitions, named `<table>_pYYYYMMDD`, and a DEFAULT
partition that takes what no day holds (an id that is not a UUIDv7, a day nobody created in
time), so no insert ever fails for want of a partition.

Days are created ahead (`AHEAD_DAYS`): by migration 0010, by `serve` at start and every
`EVERY` seconds after (`keep_ahead`). Retention (`prune_days`) folds a whole past day into
the rollups and detaches and drops its partitions, children first, in one transaction;
whatever a dropped day does not hold is left to the batched deletes of `store.prune`.
SQLite has no partitions and keeps those batched deletes.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from proxy.store import rollups
from proxy.store import tables as t
from proxy.store.cost import cost_nano, is_unpriced

log = logging.getLogger(__name__)

PARENT = "exchanges"
CHILDREN = ("tags", "completions", "choices", "usage", "logprobs", "raw_streams")
"""Partitioned like `exchanges`, on `exchange_id`."""
AHEAD_DAYS = 7
"""Days created ahead of today."""
EVERY = 3600.0
"""Seconds between two runs of `keep_ahead` in `serve`."""
FOLD_SETTINGS = ("work_mem = '256MB'", "jit = off", "enable_hashjoin = off")
"""PostgreSQL settings for the fold of a day (`SET LOCAL`: its transaction only)."""
_DAY_NAME = re.compile(r"^exchanges_p(\d{8})$")


def bound(day: date) -> str:
    """The lowest id of `day` (UTC): its first millisecond in a UUIDv7's text, the rest 0."""
    ms = int(datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() * 1000)
    h = f"{ms:012x}"
    return f"{h[:8]}-{h[8:]}-0000-0000-000000000000"


def day_of(exchange_id: str) -> date | None:
    """The UTC day a UUIDv7 id was minted on; None for an id that is not one."""
    digits = exchange_id[:8] + exchange_id[9:13]
    try:
        ms = int(digits, 16)
    except ValueError:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).date()


def name(table: str, day: date) -> str:
    return f"{table}_p{day:%Y%m%d}"


def is_partitioned(conn: sa.Connection) -> bool:
    """Whether `exchanges` is partitioned here (PostgreSQL at migration 0010 or later)."""
    if conn.dialect.name != "postgresql":
        return False
    found = conn.execute(
        sa.text("SELECT 1 FROM pg_partitioned_table WHERE partrelid = to_regclass(:t)"),
        {"t": PARENT},
    )
    return found.first() is not None


def days(conn: sa.Connection) -> list[date]:
    """The days that have partitions, oldest first."""
    found = conn.execute(
        sa.text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(:t)"
        ),
        {"t": PARENT},
    )
    matched = (_DAY_NAME.match(str(row[0])) for row in found)
    return sorted(datetime.strptime(m[1], "%Y%m%d").date() for m in matched if m)


def create_default(conn: sa.Connection) -> None:
    """Each table's DEFAULT partition."""
    for table in (PARENT, *CHILDREN):
        part = f"{table}_default"
        conn.execute(sa.text(f'CREATE TABLE IF NOT EXISTS "{part}" PARTITION OF "{table}" DEFAULT'))


def create_days(conn: sa.Connection, wanted: Iterable[date]) -> list[date]:
    """Create the partitions of each day in `wanted` that has none; returns the days created.
    A day the DEFAULT partition already holds rows of is skipped (those rows stay there)."""
    have = set(days(conn))
    created = []
    for day in sorted(set(wanted) - have):
        low, high = bound(day), bound(day + timedelta(days=1))
        try:
            with conn.begin_nested():
                for table in (PARENT, *CHILDREN):
                    conn.execute(
                        sa.text(
                            f'CREATE TABLE IF NOT EXISTS "{name(table, day)}" PARTITION OF '
                            f"\"{table}\" FOR VALUES FROM ('{low}') TO ('{high}')"
                        )
                    )
        except sa.exc.DBAPIError as exc:  # rows of that day in DEFAULT: they stay there
            log.warning("partitions for %s not created: %s", day, str(exc).splitlines()[0])
            continue
        created.append(day)
    return created


def ahead(today: date, count: int = AHEAD_DAYS) -> list[date]:
    return [today + timedelta(days=n) for n in range(count + 1)]


def due_days(conn: sa.Connection, before: datetime) -> list[date]:
    """Days whose whole partition lies before `before`, and whose exchanges all started
    before it (ids are minted as requests start, so only a clock stepped back breaks it)."""
    found = []
    for day in days(conn):
        if datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1) > before:
            break
        latest = conn.execute(
            sa.text(f'SELECT max(started_at) FROM "{name(PARENT, day)}"')
        ).scalar()
        if latest is None or latest < before:
            found.append(day)
    return found


def fold(conn: sa.Connection, day: date) -> list[rollups.Rollup]:
    """The rollups of every exchange in `day`'s partition, summed by the database by the
    rules of `rollups.fold_query` and `rollups.add` (one row per day, group and tag set).

    The three partitions are walked in their primary keys' order, which is the exchange id's
    in each, so the joins are merges and nothing is hashed before the one aggregate (a day's
    usage rows filled a hash of the whole partition first). Each exchange's tags are
    gathered as they come, unsorted (ordering each exchange's handful of tags was a sort per
    exchange); `_merged` sorts them and adds up the groups that differ only in that order."""
    ex, usage, tags = t.exchanges, t.usage, t.tags
    low, high = bound(day), bound(day + timedelta(days=1))

    def in_day(table: sa.Table) -> tuple[sa.ColumnElement[bool], ...]:
        """The day's range on `table`'s key: only the day's partition is read."""
        key = table.c.id if table is ex else table.c.exchange_id
        return key >= low, key < high

    # One big aggregate: memory to hash it without spilling to disk, no JIT compilation (it
    # costs more than it saves on a query run once a day), merge joins on the keys' order.
    for setting in FOLD_SETTINGS:
        conn.execute(sa.text(f"SET LOCAL {setting}"))
    tagged = (
        sa.select(
            tags.c.exchange_id,
            sa.func.array_agg(tags.c.key).label("tag_keys"),
            sa.func.array_agg(tags.c.value).label("tag_values"),
        )
        .where(*in_day(tags))
        .group_by(tags.c.exchange_id)
        .subquery("tagged")
    )
    keys = [
        sa.func.date_trunc("day", sa.func.timezone("UTC", ex.c.started_at)).label("day"),
        *(ex.c[column] for column in rollups.GROUP),
        tagged.c.tag_keys,
        tagged.c.tag_values,
    ]
    summed = [
        *(
            sa.func.coalesce(sa.func.sum(usage.c[total]), 0).label(total)
            for total in rollups.SUMS[1:5]
        ),
        sa.func.coalesce(sa.func.sum(cost_nano()), 0).label("cost_nano"),
        sa.func.count(ex.c.cost_usd).label("priced"),
        sa.func.count().filter(is_unpriced()).label("unpriced"),
    ]
    query = (
        sa.select(*keys, sa.func.count().label("requests"), *summed)
        .select_from(
            ex.outerjoin(usage, sa.and_(usage.c.exchange_id == ex.c.id, *in_day(usage))).outerjoin(
                tagged, tagged.c.exchange_id == ex.c.id
            )
        )
        .where(*in_day(ex))
        .group_by(*(sa.literal_column(str(n)) for n in range(1, len(keys) + 1)))  # by position
    )
    return _merged(_rollup(row) for row in conn.execute(query))


def _rollup(row: Any) -> rollups.Rollup:
    pairs = zip(row.tag_keys or (), row.tag_values or (), strict=True)
    found = rollups.Rollup(
        row.day.replace(tzinfo=UTC),
        tuple(getattr(row, column) for column in rollups.GROUP),
        tuple(sorted(pairs)),
    )
    for total in rollups.SUMS:
        found.totals[total] = int(getattr(row, total))
    return found


def _merged(found: Iterable[rollups.Rollup]) -> list[rollups.Rollup]:
    """`found` with the rollups of one id (the same tags, gathered in another order) added
    up: one row per id, as the upsert of `rollups.save` needs."""
    merged: dict[str, rollups.Rollup] = {}
    for rollup in found:
        into = merged.setdefault(rollup.id, rollup)
        if into is not rollup:
            for total in rollups.SUMS:
                into.totals[total] += rollup.totals[total]
    return list(merged.values())


def drop_day(conn: sa.Connection, day: date) -> int:
    """Fold `day` into the rollups, then detach and drop its partitions, children first (a
    database from before migration 0012 checks its foreign keys against what is left);
    returns how many exchanges went.

    The day's partitions are locked against writes first, so a record written late (a
    journal replayed) cannot land between the fold and the drop; inserts into other days go
    on, and wait only for the detaching at the end."""
    for table in (PARENT, *CHILDREN):
        conn.execute(sa.text(f'LOCK TABLE "{name(table, day)}" IN SHARE MODE'))
    folded = fold(conn, day)
    rollups.save(conn, folded)
    for table in (*CHILDREN, PARENT):
        part = name(table, day)
        conn.execute(sa.text(f'ALTER TABLE "{table}" DETACH PARTITION "{part}"'))
        conn.execute(sa.text(f'DROP TABLE "{part}"'))
    return sum(rollup.totals["requests"] for rollup in folded)  # each exchange in one rollup
