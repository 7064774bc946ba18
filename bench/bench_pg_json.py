"""What PostgreSQL's `json` type costs the server: the same COPY into `json` and `text` columns.

    python -m bench.bench_pg_json --pg postgresql+asyncpg://postgres@127.0.0.1:5432/postgres
        [--exchanges 2000] [--rounds 2]

A value bound for a `json` column is parsed by the server to check it (binary COPY included);
`text` is stored as it comes. The exchanges' `response` and the logprobs' `bytes` and
`top_logprobs` are `json` (docs/schema.md). In a throwaway database this copies, in batches
of 500 exchanges as the recorder does: the recorder bench's response with 100 logprob tokens
(~39 KB) and without, into a table of an id and that column; and the 100 logprob rows of each
exchange into a table shaped as `logprobs`, its two JSON columns either type. It prints the
wall time per exchange of each (the server's parse is most of the difference), the two
types alternating, `--rounds` times.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import asyncpg  # type: ignore[import-untyped]
import orjson

from bench.bench_record import dsn, exchange, pg_database
from proxy.store.logprob_rows import logprob_records

BATCH = 500
TYPES = ("json", "text")
BODY = "CREATE TABLE bench_body (id varchar(36) PRIMARY KEY, response {type})"
ROWS = (
    "CREATE TABLE bench_logprobs (exchange_id varchar(36), choice_index int, kind varchar, "
    "position int, token text NOT NULL, logprob double precision, bytes {type}, "
    "top_logprobs {type}, PRIMARY KEY (exchange_id, choice_index, kind, position))"
)


def cases(exchanges: int) -> dict[str, tuple[str, str, list[list[tuple[Any, ...]]]]]:
    """name: (table, CREATE statement, batches of records)."""
    found = {}
    for tokens in (100, 0):
        ex = exchange(tokens)
        body = orjson.dumps(ex.response_json).decode()
        records = [(f"bench-{n:08d}", body) for n in range(exchanges)]
        name = f"response, {len(body):,} bytes"
        found[name] = ("bench_body", BODY, _batches(records, BATCH))
    ex = exchange(100)
    tokens = ex.response_json["choices"][0]["logprobs"]["content"]
    rows = [
        r for n in range(exchanges) for r in logprob_records(f"bench-{n:08d}", 0, "content", tokens)
    ]
    found["100 logprob rows"] = ("bench_logprobs", ROWS, _batches(rows, BATCH * len(tokens)))
    return found


def _batches(records: list[Any], size: int) -> list[list[Any]]:
    return [records[at : at + size] for at in range(0, len(records), size)]


async def copy_time(
    conn: asyncpg.Connection, table: str, create: str, type_: str, batches: list[list[Any]]
) -> float:
    await conn.execute(f"DROP TABLE IF EXISTS {table}")
    await conn.execute(create.format(type=type_))
    began = time.perf_counter()
    for batch in batches:
        async with conn.transaction():
            await conn.copy_records_to_table(table, records=batch)
    return time.perf_counter() - began


async def main(args: argparse.Namespace) -> None:
    found = cases(args.exchanges)
    async with pg_database(args.pg) as url:
        conn = await asyncpg.connect(dsn(url))
        try:
            await conn.execute("SET default_toast_compression = lz4")  # as the recorder asks
            for name, (table, create, batches) in found.items():
                seen: dict[str, list[float]] = {type_: [] for type_ in TYPES}
                for turn in range(args.rounds):
                    for type_ in TYPES if turn % 2 == 0 else TYPES[::-1]:
                        seconds = await copy_time(conn, table, create, type_, batches)
                        seen[type_].append(seconds / args.exchanges * 1e6)
                medians = {type_: statistics.median(us) for type_, us in seen.items()}
                print(
                    f"{name:28s} json {medians['json']:7.1f} µs  text {medians['text']:7.1f} µs"
                    f"  a exchange  (json - text {medians['json'] - medians['text']:+.1f} µs)"
                )
        finally:
            await conn.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--pg", required=True, help="a PostgreSQL URL; a scratch database is made beside it"
    )
    parser.add_argument("--exchanges", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
