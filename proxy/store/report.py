"""The spend report behind `flightrec cost` (`reprice.py` does `--reprice`).

`cost_report` is one SQL statement per call: `exchanges` joined with `usage` (and with `tags`
for `--by tag:<k>` or `--tag` filters), aggregated by the database, so a report over millions
of exchanges never brings a row into Python; beside it (UNION ALL) the same groups of the
daily rollups that pruned exchanges left (`rollups.py`).

What the report counts (the README's *Cost* section says it for users):

- `requests`: every exchange in the group, whatever its endpoint or outcome.
- token columns: sums of the `usage` columns (a missing count adds 0).
- `cost_usd`: the sum of the stored costs. Summed in SQL as whole nano-dollars (each cost is
  rounded to 1e-9 USD first), so the sum is exact, the same on both engines and in every
  grouping: the groups of any `--by` add up to the same grand total, to the last digit. None
  when the group has unpriced exchanges and no priced one: such a group is unknown, not free.
- `unpriced_requests`: exchanges that should have a cost and have none: usage was recorded
  but its model has no price (or the usage has no shape we can price), the endpoint reports
  usage and the response had none (`usage_source = 'missing'`, e.g. a stream cut short), or
  the request named a model and succeeded (status < 400) with no usage at all (speech, image
  generation: paid, but nothing we can price). A request that names no model (`/models`,
  files), fails upstream, or is a free moderation is a request that cost nothing.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from proxy.store import rollups
from proxy.store import tables as t
from proxy.store.cost import NANO, cost_nano, group_column, is_unpriced, merge, parse_by
from proxy.store.filters import Filters
from proxy.text import printable, spreadsheet_text

COLUMNS = (
    "group",
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cost_usd",
    "unpriced_requests",
)
"""The fields of each report row (SPEC section 6), in output order."""


def _report_query(by: str, filters: Filters, dialect: str) -> sa.CompoundSelect[Any]:
    """Kept exchanges and rollups of pruned ones, each grouped, in one statement (one
    snapshot: a prune committing meanwhile moves nothing between the two sides)."""
    ex, usage = t.exchanges, t.usage
    group, source = group_column(by, dialect)
    nano, unpriced = cost_nano(), is_unpriced()
    columns: list[Any] = [
        group.label("group"),
        sa.func.count().label("requests"),
        sa.func.sum(usage.c.prompt_tokens).label("prompt_tokens"),
        sa.func.sum(usage.c.cached_tokens).label("cached_tokens"),
        sa.func.sum(usage.c.completion_tokens).label("completion_tokens"),
        sa.func.sum(usage.c.reasoning_tokens).label("reasoning_tokens"),
        sa.func.sum(nano).label("cost_nano"),
        sa.func.count(ex.c.cost_usd).label("priced"),
        sa.func.sum(sa.case((unpriced, 1), else_=0)).label("unpriced_requests"),
    ]
    if by == "key":
        columns.append(sa.func.max(ex.c.key_hint).label("key_hint"))
    kept = sa.select(*columns).select_from(source).where(*filters.where()).group_by(group)
    rolled_group, rolled_source = rollups.group_column(by, dialect)
    rolled_columns: list[Any] = [rolled_group.label("group"), *rollups.sums(*rollups.SUMS)]
    if by == "key":
        rolled_columns.append(sa.func.max(t.rollups.c.key_hint).label("key_hint"))
    rolled = (
        sa.select(*rolled_columns)
        .select_from(rolled_source)
        .where(*rollups.where(filters))
        .group_by(rolled_group)
    )
    return sa.union_all(kept, rolled)


def _row(found: dict[str, Any], by: str) -> dict[str, Any]:
    unpriced = found["unpriced_requests"]
    row: dict[str, Any] = {
        "group": found["group"],
        **{name: found[name] for name in COLUMNS[1:6]},
        # Exact: a whole number of nano-dollars, as a Decimal.
        "cost_usd": None if found["priced"] == 0 and unpriced else found["cost_nano"] * NANO,
        "unpriced_requests": unpriced,
    }
    if by == "key":
        row["key_hint"] = found["key_hint"]
    return row


def _order(by: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if by == "day":
        return sorted(rows, key=lambda r: (r["group"] is None, r["group"] or ""))
    # Dearest first; unknown-cost groups after the priced ones, then by size.
    return sorted(
        rows,
        key=lambda r: (
            r["cost_usd"] is None,
            -(r["cost_usd"] or 0),
            -r["requests"],
            str(r["group"]),
        ),
    )


async def cost_report(
    engine: AsyncEngine, by: str = "model", filters: Filters | None = None
) -> list[dict[str, Any]]:
    """One row per group: `COLUMNS` (`cost_usd` a Decimal, or None), plus `key_hint` by key."""
    by = parse_by(by)
    query = _report_query(by, filters or Filters(), engine.dialect.name)
    async with engine.connect() as conn:
        found = (await conn.execute(query)).all()
    return _order(by, [_row(row, by) for row in merge(found, ["group"])])


def total(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The grand total of report rows (exact: costs are Decimals)."""
    rows = list(rows)
    out: dict[str, Any] = {"group": "TOTAL"}
    for column in COLUMNS[1:]:
        values = [row[column] for row in rows]
        if column == "cost_usd":
            known = [v for v in values if v is not None]
            unknown = len(known) < len(values)
            out[column] = None if unknown and not known else sum(known, Decimal(0))
        else:
            out[column] = sum(values)
    return out


def usd(value: Decimal | None) -> str:
    """An exact cost for people and CSV: '0.0012345', '12.50'; '' when unknown."""
    if value is None:
        return ""
    whole, _, fraction = f"{value:.9f}".partition(".")
    return f"{whole}.{fraction.rstrip('0').ljust(2, '0')}"


def as_json(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows for `--format json`; a cost has at most 15 significant digits, so the float's
    shortest form (what JSON gets) is the exact decimal."""
    return [
        {**row, "cost_usd": None if row["cost_usd"] is None else float(row["cost_usd"])}
        for row in rows
    ]


def as_csv(rows: list[dict[str, Any]], by: str) -> str:
    out = io.StringIO()
    columns = [*COLUMNS, "key_hint"] if by == "key" else list(COLUMNS)
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        cells = {**row, "cost_usd": usd(row["cost_usd"])}
        for text in ("group", "key_hint"):
            if isinstance(cells.get(text), str):
                cells[text] = spreadsheet_text(cells[text])
        writer.writerow(["" if cells[c] is None else cells[c] for c in columns])
    return out.getvalue()


def as_table(rows: list[dict[str, Any]], by: str) -> str:
    """Aligned columns and a TOTAL row; an unknown group is '(none)', an unknown cost
    'unpriced' (as the console says it)."""
    header = [by.upper(), "REQUESTS", "PROMPT", "CACHED", "COMPLETION", "REASONING"]
    header += ["COST USD", "UNPRICED"]
    if by == "key":
        header.insert(1, "HINT")

    def cells(row: dict[str, Any]) -> list[str]:
        group = row["group"]
        line = ["(none)" if group is None else str(group)]
        if by == "key":
            line.append(row.get("key_hint") or "-")
        line += [f"{row[c]:,}" for c in COLUMNS[1:6]]
        line += [usd(row["cost_usd"]) or "unpriced", f"{row['unpriced_requests']:,}"]
        return line

    lines = [header, *([printable(cell, cell=True) for cell in cells(row)] for row in rows)]
    summed = cells(total(rows))
    if by == "key":
        summed[1] = ""
    widths = [max(len(line[i]) for line in [*lines, summed]) for i in range(len(header))]
    texts = 2 if by == "key" else 1  # left-aligned text columns, numbers to the right

    def render(line: list[str]) -> str:
        return "  ".join(
            cell.ljust(width) if i < texts else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(line, widths, strict=True))
        ).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([*(render(line) for line in lines), rule, render(summed)])
