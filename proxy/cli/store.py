"""The database commands of `flightrec`: `db upgrade`, `logs`, `show`, `cost`, `export`.

Thin: each parses flags and calls into proxy/store (queries, the cost report's SQL) or
proxy/tools/export.py. `proxy/cli/main.py` adds them to the `flightrec` group.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import click

from proxy.cli.options import (
    config_option,
    db_option,
    load_config,
    parse_with,
    print_json,
    report_format_option,
    scan_filters,
    since_option,
    tag_option,
    until_option,
    user_errors,
)

DB_ONLY = ("db_url",)
"""What the commands that only read or migrate the database use of the config."""


@click.group()
def db() -> None:
    """Manage the database schema."""


@db.command("upgrade")
@config_option
@db_option
@user_errors
def db_upgrade(config_path: str | None, db_url: str | None) -> None:
    """Migrate the database to the newest schema."""
    from proxy.store.engine import safe_url
    from proxy.store.migrate import head, upgrade

    cfg = load_config(config_path, db_url=db_url, uses=DB_ONLY)
    asyncio.run(upgrade(cfg.db_url))
    click.echo(f"{safe_url(cfg.db_url)}: schema at {head()}")


@click.command()
@config_option
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=1))
@click.option("--model", default=None, help="Only exchanges that requested or got this model.")
@since_option
@tag_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@db_option
@user_errors
def logs(
    config_path: str | None,
    limit: int,
    model: str | None,
    since: Any,
    tags: list[tuple[str, str]],
    as_json: bool,
    db_url: str | None,
) -> None:
    """Recent exchanges, newest first."""
    from proxy.store import browse, read

    cfg = load_config(config_path, db_url=db_url, uses=DB_ONLY)

    async def fetch() -> list[dict[str, Any]]:
        async with read.reading(cfg.db_url) as engine:
            return await browse.list_exchanges(
                engine, limit=limit, model=model, since=since, tags=list(tags)
            )

    found = asyncio.run(fetch())
    if as_json:
        print_json(found)
    else:
        click.echo(read.render_table(found))


@click.command()
@config_option
@click.argument("exchange_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the exchange as one JSON object.")
@db_option
@user_errors
def show(config_path: str | None, exchange_id: str, as_json: bool, db_url: str | None) -> None:
    """One exchange in full (ID or a unique prefix of at least 8 characters)."""
    from proxy.store import read

    cfg = load_config(config_path, db_url=db_url, uses=DB_ONLY)

    async def fetch() -> dict[str, Any]:
        async with read.reading(cfg.db_url) as engine:
            return await read.get_exchange(engine, exchange_id)

    shown = asyncio.run(fetch())
    if as_json:
        print_json(shown)
    else:
        click.echo(read.render_exchange(shown))


# --- `cost`: the spend report (thin; the SQL is in proxy/store/report.py) ---


def _parse_by(value: str) -> str:
    from proxy.store.cost import parse_by

    return parse_by(value)


@click.command()
@config_option
@click.option(
    "--by",
    default="model",
    show_default=True,
    callback=parse_with(_parse_by),
    help="Group by model, key, user, tag:<key>, day (UTC) or upstream.",
)
@since_option
@until_option
@click.option("--model", default=None, help="Only exchanges that requested or got this model.")
@click.option("--key", default=None, help="Only this API key: its hint (sk-...a1b2) or hash.")
@tag_option
@report_format_option
@click.option(
    "--reprice",
    is_flag=True,
    help="First recompute the stored costs with today's prices (genai-prices + config).",
)
@click.option(
    "--dry-run", is_flag=True, help="With --reprice: say what would change, write nothing."
)
@db_option
@user_errors
def cost(
    config_path: str | None,
    by: str,
    since: Any,
    until: Any,
    model: str | None,
    key: str | None,
    tags: list[tuple[str, str]],
    fmt: str,
    reprice: bool,
    dry_run: bool,
    db_url: str | None,
) -> None:
    """Spend per model, key, user, tag, day or upstream, with a total."""
    from proxy.keynames import KeyNames
    from proxy.pricing import Prices, upstream_providers
    from proxy.store import read, report
    from proxy.store import reprice as repricing
    from proxy.store.filters import Filters

    cfg = load_config(config_path, db_url=db_url, uses=("db_url", "prices", "keys"))
    if since is not None and until is not None and since >= until:
        raise click.UsageError("--since must be earlier than --until")
    if dry_run and not reprice:
        raise click.UsageError("--dry-run goes with --reprice")
    names = KeyNames(cfg.keys)
    filters = Filters(since, until, model, names.resolve(key) if key else key, tuple(tags))
    prices = Prices(cfg.prices, upstream_providers(cfg.upstreams)) if reprice else None

    async def run() -> tuple[repricing.Repriced | None, list[dict[str, Any]]]:
        async with read.reading(cfg.db_url) as engine:
            done = None
            if prices is not None:
                done = await repricing.reprice(engine, prices, filters, dry_run=dry_run)
            return done, await report.cost_report(engine, by, filters)

    done, rows = asyncio.run(run())
    if by == "key" and names.table:
        for row in rows:
            row["key_name"] = names.name(row["group"], row["key_hint"])
            if fmt == "table" and row["key_name"]:
                row["key_hint"] = f"{row['key_name']} ({row['key_hint']})"
    if done is not None:
        click.echo(repricing.summary(done), err=True)
    if fmt == "json":
        print_json(report.as_json(rows))
    elif fmt == "csv":
        click.echo(report.as_csv(rows, by), nl=False)
    else:
        click.echo(report.as_table(rows, by))


# --- `export` (thin; the work is in proxy/tools/export.py) ---


@click.command()
@config_option
@click.option(
    "--format", "fmt", type=click.Choice(["jsonl", "csv", "har", "batch"]), default="jsonl",
    show_default=True,
)  # fmt: skip
@since_option
@until_option
@click.option("--model", default=None, help="Only exchanges that requested this model.")
@tag_option
@click.option("--limit", default=None, type=click.IntRange(min=1), help="At most N exchanges.")
@click.option(
    "--endpoint",
    default="/v1/chat/completions",
    show_default=True,
    help="--format batch: the one endpoint the batch runs.",
)
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False), default=None, help="File (default stdout)."
)
@db_option
@user_errors
def export(
    config_path: str | None,
    fmt: str,
    since: Any,
    until: Any,
    model: str | None,
    tags: list[tuple[str, str]],
    limit: int | None,
    endpoint: str,
    output: str | None,
    db_url: str | None,
) -> None:
    """Export exchanges, oldest first: JSONL, CSV, HAR 1.2 or OpenAI Batch API input."""
    import sys

    from proxy.privacy.keep import redactor_for
    from proxy.store import read
    from proxy.tools import export as export_mod

    if endpoint not in export_mod.BATCH_ENDPOINTS:
        raise click.BadParameter(
            f"expected one of {', '.join(export_mod.BATCH_ENDPOINTS)}", param_hint="--endpoint"
        )
    filters = scan_filters(since, until, model, tags, limit)
    uses = ("db_url", "redact", "upstreams", "pseudonym_key", "spool_path")
    cfg = load_config(config_path, db_url=db_url, uses=uses)

    redactor = redactor_for(cfg)

    async def run(write: export_mod.Write) -> int:
        async with read.reading(cfg.db_url) as engine:
            return await export_mod.export(
                engine,
                write,
                fmt,
                filters,
                upstreams=cfg.upstreams,
                endpoint=endpoint,
                redactor=redactor,
            )

    with contextlib.ExitStack() as stack:
        out = sys.stdout.buffer if output is None else stack.enter_context(open(output, "wb"))
        count = asyncio.run(run(out.write))
        out.flush()
    if output is not None:
        click.echo(f"exported {count} exchanges to {output}", err=True)


# --- `prune`: retention by hand (thin; the work is in proxy/store/prune.py) ---


def _parse_before(value: str) -> Any:
    from datetime import UTC, datetime

    from proxy.store.read import parse_since

    when = parse_since(value)
    if when > datetime.now(UTC):
        raise ValueError(f"{value!r} is in the future")
    return when


@click.command()
@config_option
@click.option(
    "--before",
    default=None,
    callback=parse_with(_parse_before),
    help="Prune exchanges started before T: an age (90d, 12h, 2w) or an ISO date/time "
    "(local time if no zone). Default: the config's retention_days and retention_bodies_days.",
)
@click.option(
    "--bodies",
    is_flag=True,
    help="With --before: drop only bodies, choices, logprobs and raw streams; keep the rest.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be pruned; change nothing.")
@db_option
@user_errors
def prune(
    config_path: str | None, before: Any, bodies: bool, dry_run: bool, db_url: str | None
) -> None:
    """Delete old exchanges; their usage and cost stay in daily rollups, so every cost
    report is unchanged."""
    from datetime import UTC, datetime

    from proxy.store import read
    from proxy.store.prune import Busy, by_whole_days, pruning
    from proxy.store.retention import cutoffs

    cfg = load_config(
        config_path, db_url=db_url, uses=("db_url", "retention_days", "retention_bodies_days")
    )
    if bodies and before is None:
        raise click.UsageError("--bodies needs --before T")
    if before is None and not cutoffs(cfg, datetime.now(UTC)):
        raise click.UsageError("give --before T, or set retention_days in the config")

    async def run() -> list[str]:
        async with read.reading(cfg.db_url) as engine, pruning(engine) as pruner:
            found = [(before, bodies)]
            if before is None:  # the configured retention, as `serve` applies it
                whole_days = await by_whole_days(pruner)
                found = cutoffs(cfg, datetime.now(UTC), whole_days=whole_days)
            return [await _prune_one(pruner, when, only, dry_run) for when, only in found]

    try:
        lines = asyncio.run(run())
    except Busy as exc:
        raise click.ClickException(f"{exc}; try again later") from None
    for line in lines:
        click.echo(line)
    if dry_run:
        click.echo("dry run: nothing changed")


async def _prune_one(pruner: Any, before: Any, bodies: bool, dry_run: bool) -> str:
    """Prune (or plan to) before `before`; one line saying what was (or would be) done."""
    from proxy.store.prune import plan, prune
    from proxy.store.retention import exchanges

    what = "the bodies of " if bodies else ""
    at = before.isoformat(timespec="seconds")
    if not dry_run:
        done = await prune(pruner, before, bodies=bodies)
        return f"pruned {what}{exchanges(done.count)} started before {at}"
    would = await plan(pruner, before, bodies=bodies)
    oldest = "" if would.oldest is None else f" (the oldest from {str(would.oldest)[:19]})"
    return f"would prune {what}{exchanges(would.exchanges)} started before {at}{oldest}"
