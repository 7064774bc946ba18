"""`flightrec reconcile`: the provider's figures beside the record's, per UTC day and model.

Each row says what the provider counted (its Usage and Costs APIs, `provider_usage`), what the
record holds (`store.daily`), the difference (provider minus record), and what explains it
where that is known:

- `bypassed`: the provider counted requests (and tokens) the record does not have: traffic
  that did not pass through the proxy (another client, another process not writing to this
  database, the provider's own tools);
- `not billed`: the record has requests the provider does not count (another organization's
  key, requests it did not bill);
- `unpriced`: exchanges in the record that have no cost (a model the price table lacks);
- `price drift`: the same requests and tokens, a different cost: the record's prices are not
  what the provider billed (a price changed, or the table is wrong);
- nothing: the two agree (costs within `AGREE_USD`).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from proxy.text import printable, spreadsheet_text
from proxy.tools.provider_usage import Days, ProviderDay

AGREE_USD = Decimal("0.000001")
"""Costs closer than this agree: the Costs API gives amounts to about a millionth of a dollar."""
FIELDS = (
    "day",
    "model",
    "provider_requests",
    "record_requests",
    "provider_input_tokens",
    "record_input_tokens",
    "provider_output_tokens",
    "record_output_tokens",
    "provider_cost_usd",
    "record_cost_usd",
    "difference_usd",
    "record_unpriced",
    "explanation",
)
"""The fields of each row, in output order (`--format json` objects, CSV columns)."""


@dataclass(slots=True)
class RecordDay:
    requests: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    unpriced: int = 0


def _record(found: Mapping[str, Any] | None) -> RecordDay:
    if found is None:
        return RecordDay()
    names = ("requests", "input_tokens", "cached_tokens", "output_tokens", "cost_usd", "unpriced")
    return RecordDay(*(found[name] for name in names))


def compare(
    provider: Days, record: Mapping[tuple[str, str], Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """One row per (day, model) either side has, sorted by day then model."""
    rows = []
    for day, model in sorted(set(provider) | set(record)):
        theirs = provider.get((day, model)) or ProviderDay()
        ours = _record(record.get((day, model)))
        cost = None if ours.cost_usd is None else Decimal(repr(ours.cost_usd))
        difference = None
        if theirs.cost is not None or cost is not None:
            difference = (theirs.cost or Decimal(0)) - (cost or Decimal(0))
        rows.append(
            {
                "day": day,
                "model": model,
                "provider_requests": theirs.requests,
                "record_requests": ours.requests,
                "provider_input_tokens": theirs.input_tokens,
                "record_input_tokens": ours.input_tokens,
                "provider_output_tokens": theirs.output_tokens,
                "record_output_tokens": ours.output_tokens,
                "provider_cost_usd": None if theirs.cost is None else float(theirs.cost),
                "record_cost_usd": ours.cost_usd,
                "difference_usd": None if difference is None else float(difference),
                "record_unpriced": ours.unpriced,
                "explanation": explain(theirs, ours, difference),
            }
        )
    return rows


def explain(theirs: ProviderDay, ours: RecordDay, difference: Decimal | None) -> str:
    """What explains the difference, as far as it is known; "" when the two agree."""
    said = []
    more = theirs.requests - ours.requests
    tokens_in = theirs.input_tokens - ours.input_tokens
    tokens_out = theirs.output_tokens - ours.output_tokens
    if more > 0 or (more == 0 and (tokens_in > 0 or tokens_out > 0) and ours.requests == 0):
        said.append(
            f"bypassed: {more} requests, {tokens_in} input and {tokens_out} output tokens "
            "the provider counted are not in the record"
        )
    elif more < 0:
        said.append(f"not billed: {-more} requests in the record the provider does not count")
    if ours.unpriced:
        said.append(f"unpriced: {ours.unpriced} exchanges in the record have no cost")
    off = difference is not None and abs(difference) >= AGREE_USD
    if off and more == 0 and tokens_in == 0 and tokens_out == 0 and not ours.unpriced:
        said.append(f"price drift: same requests and tokens, costs differ by ${difference}")
    elif off and not said:
        said.append("the tokens differ: see the token columns")
    return "; ".join(said)


def _money(value: float | None) -> str:
    return "" if value is None else f"{value:.6f}"


def as_table(rows: list[dict[str, Any]]) -> str:
    """Aligned columns: requests, tokens and costs side by side, then the explanation."""
    head = ("day", "model", "requests p/r", "input p/r", "output p/r", "cost p", "cost r",
            "difference", "explanation")  # fmt: skip
    lines = [head]
    for row in rows:
        lines.append(
            (
                row["day"],
                printable(row["model"] or "(none)", cell=True),
                f"{row['provider_requests']}/{row['record_requests']}",
                f"{row['provider_input_tokens']}/{row['record_input_tokens']}",
                f"{row['provider_output_tokens']}/{row['record_output_tokens']}",
                _money(row["provider_cost_usd"]),
                _money(row["record_cost_usd"]),
                _money(row["difference_usd"]),
                row["explanation"] or "agrees",
            )
        )
    if len(lines) == 1:
        return "nothing in the period, on either side"
    widths = [max(len(line[i]) for line in lines) for i in range(len(head) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False))
        + "  "
        + line[-1]
        for line in lines
    )


def as_csv(rows: list[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(FIELDS)
    for row in rows:
        writer.writerow(
            [spreadsheet_text(v) if isinstance(v, str) else ("" if v is None else v)
             for v in (row[name] for name in FIELDS)]
        )  # fmt: skip
    return out.getvalue()
