"""`flightrec reconcile`: the provider's cost and usage reports beside the record's (SPEC 12).

Thin: the provider's figures come from `proxy.tools.provider_usage`, the record's from
`proxy.store.daily`, the comparison and its outputs from `proxy.tools.reconcile`.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import click

from proxy.cli.options import (
    config_option,
    db_option,
    load_config,
    print_json,
    report_format_option,
    since_option,
    until_option,
    user_errors,
)

DEFAULT_DAYS = 7
"""Days back from today (UTC) that are reconciled without --since."""


@click.command()
@config_option
@since_option
@until_option
@click.option("--upstream", "upstream_name", default=None, help="Upstream name (default: first).")
@click.option(
    "--admin-key-env",
    default="OPENAI_ADMIN_KEY",
    show_default=True,
    help="Environment variable holding the provider's admin key (never stored or logged).",
)
@report_format_option
@db_option
@user_errors
def reconcile(
    config_path: str | None,
    since: Any,
    until: Any,
    upstream_name: str | None,
    admin_key_env: str,
    fmt: str,
    db_url: str | None,
) -> None:
    """The provider's own cost and usage per UTC day and model beside the record's, the
    difference, and what explains it where known. Days are whole: --since starts at its
    day's midnight (UTC)."""
    from proxy.store import read
    from proxy.store.daily import record_days
    from proxy.tools import reconcile as rec
    from proxy.tools.provider_usage import ProviderError, provider_days

    cfg = load_config(config_path, db_url=db_url)
    upstreams = {u.name: u for u in cfg.upstreams}
    if upstream_name is not None and upstream_name not in upstreams:
        known = ", ".join(upstreams)
        raise click.BadParameter(
            f"no upstream {upstream_name!r} (known: {known})", param_hint="--upstream"
        )
    upstream = upstreams[upstream_name] if upstream_name else cfg.upstreams[0]
    admin_key = os.environ.get(admin_key_env, "").strip()
    if not admin_key:
        raise click.ClickException(f"set {admin_key_env} to the provider's admin key")
    now = datetime.now(UTC)
    start = since if since is not None else now - timedelta(days=DEFAULT_DAYS)
    start = start.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    end = until if until is not None else now
    if start >= end:
        raise click.UsageError("--since must be earlier than --until")

    async def run() -> list[dict[str, Any]]:
        async with read.reading(cfg.db_url) as engine:  # a bad database fails first
            provider = await provider_days(upstream.base_url, admin_key, start, end)
            record = await record_days(engine, upstream.name, start, end)
        return rec.compare(provider, record)

    try:
        rows = asyncio.run(run())
    except ProviderError as exc:
        raise click.ClickException(f"the provider's report: {exc}") from None
    if fmt == "json":
        print_json(rows)
    elif fmt == "csv":
        click.echo(rec.as_csv(rows), nl=False)
    else:
        click.echo(rec.as_table(rows))
