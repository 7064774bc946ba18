"""The `flightrec` command line. Thin: each command parses flags and calls into the modules.

This module holds the group and the serving commands (`serve`, `console`, `health`,
`replay`, `playback`); the database commands are in `proxy/cli/store.py`, the shared flags in
`proxy/cli/options.py`.

Every error a user can cause (bad config, unknown id, unreachable database) becomes one line on
stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import click
from click.exceptions import NoArgsIsHelpError

from proxy.cli import store as cli_store
from proxy.cli.alerts import alerts
from proxy.cli.options import (
    config_option,
    db_option,
    load_config,
    parse_with,
    print_json,
    scan_filters,
    since_option,
    tag_option,
    user_errors,
)
from proxy.health import check
from proxy.logs import log_to_stderr


class OneLineErrors(click.Group):
    """Usage errors in one line, `Error: <message>`, without click's usage block and hint.

    Every error is raised while making a context or invoking one, here or in a subcommand
    below, so catching them at the top covers every command.
    """

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with _one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with _one_line():
            return super().invoke(ctx)


@contextlib.contextmanager
def _one_line() -> Iterator[None]:
    try:
        yield
    except NoArgsIsHelpError:
        raise  # a group called bare shows its help
    except click.UsageError as exc:
        exc.ctx = None  # what `UsageError.show` prints the usage block and hint from
        raise


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="flightrec")
def main() -> None:
    """flightrec: a logging reverse proxy for OpenAI-compatible APIs."""


@main.command()
@config_option
@click.option("--host", default=None, help="Address to listen on (default 127.0.0.1).")
@click.option("--port", default=None, type=int, help="Port to listen on (default 8080).")
@click.option("--upstream", default=None, help="Base URL of the first upstream.")
@db_option
@click.option("--workers", default=None, type=int, help="Processes sharing the port (default 1).")
@click.option(
    "--console-port", default=None, type=int, help="Port of the console (default 8081; 0: none)."
)
@user_errors
def serve(
    config_path: str | None,
    host: str | None,
    port: int | None,
    upstream: str | None,
    db_url: str | None,
    workers: int | None,
    console_port: int | None,
) -> None:
    """Run the proxy (and the console beside it)."""
    cfg = load_config(
        config_path, host=host, port=port, upstream=upstream, db_url=db_url, workers=workers,
        console_port=console_port,
    )  # fmt: skip
    from proxy.console.auth import check_bind

    check_bind(cfg.console_host if cfg.console_port else "127.0.0.1", cfg.console_token)
    log_to_stderr(cfg.log_level)
    if cfg.workers > 1:
        from proxy.workers import supervise

        raise SystemExit(supervise(cfg))
    from proxy.serve import run  # keep `flightrec logs` from importing aiohttp's server

    asyncio.run(run(cfg))


@main.command()
@config_option
@click.option("--host", default=None, help="Address to listen on (default 127.0.0.1).")
@click.option("--port", default=None, type=int, help="Port to listen on (default 8081).")
@db_option
@user_errors
def console(
    config_path: str | None, host: str | None, port: int | None, db_url: str | None
) -> None:
    """Serve the console (pages and JSON API) alone, against a database."""
    flags = {"console_host": "--host", "console_port": "--port"}
    cfg = load_config(config_path, flags, console_host=host, console_port=port, db_url=db_url)
    from proxy.console import check_bind, run_console

    check_bind(cfg.console_host, cfg.console_token, "--host" if host is not None else None)
    log_to_stderr(cfg.log_level)
    asyncio.run(run_console(cfg))


@main.command()
@config_option
@click.option("--host", default=None, help="The address serve listens on (default 127.0.0.1).")
@click.option("--port", default=None, type=int, help="The port serve listens on (default 8080).")
@click.option("--ready", is_flag=True, help="Ask /readyz (records flow) instead of /healthz (up).")
@click.option("--timeout", default=5.0, type=float, show_default=True, help="Seconds to wait.")
@user_errors
def health(
    config_path: str | None, host: str | None, port: int | None, ready: bool, timeout: float
) -> None:
    """Ask the proxy this config describes whether it is up; exit 0 if so, else 1."""
    found = check(load_config(config_path, host=host, port=port), ready=ready, timeout=timeout)
    click.echo(found.line, err=not found.ok)
    raise SystemExit(0 if found.ok else 1)


# --- `replay`, `playback` (thin; the work is in proxy/tools/replay.py and playback.py) ---


def _parse_match(value: str) -> tuple[str, ...]:
    """`exact`, or `ignore-fields=F,G` (also `ignore-fields:F,G` or `ignore-fields F,G`)."""
    if value == "exact":
        return ()
    name, sep, fields = value[:13], value[13:14], value[14:]
    found = tuple(f.strip() for f in fields.split(",") if f.strip())
    if name != "ignore-fields" or sep not in ("=", ":", " ") or not found:
        raise ValueError(f"expected exact or ignore-fields=F,G,... got {value!r}")
    return found


@main.command()
@config_option
@click.argument("ids", nargs=-1, metavar="[ID]...")
@click.option("--model", default=None, help="Send the requests to this model instead.")
@click.option("--upstream", "upstream_name", default=None, help="Send to this upstream (name).")
@click.option("--stream/--no-stream", default=None, help="Force streaming on or off.")
@click.option("--concurrency", default=4, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--api-key-env",
    default=None,
    help="Environment variable with the API key (default: the upstream's api_key_env).",
)
@since_option
@click.option("--from-model", default=None, help="Select: exchanges that requested this model.")
@tag_option
@click.option(
    "--limit", default=None, type=click.IntRange(min=1), help="Select: the newest N (default 10)."
)
@click.option(
    "--allow-redacted", is_flag=True, help="Replay exchanges [[redact]] rules matched, as stored."
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of comparisons.")
@db_option
@user_errors
def replay(
    config_path: str | None,
    ids: tuple[str, ...],
    model: str | None,
    upstream_name: str | None,
    stream: bool | None,
    concurrency: int,
    api_key_env: str | None,
    since: Any,
    from_model: str | None,
    tags: list[tuple[str, str]],
    limit: int | None,
    allow_redacted: bool,
    as_json: bool,
    db_url: str | None,
) -> None:
    """Re-send recorded requests through the proxy, record them, compare with the originals.

    Give exchange IDs, or select instead with --since, --from-model and --tag (the newest
    --limit). Exit status 1 when a replay did not succeed (its failure is recorded and shown)."""
    from proxy.tools import replay as replay_mod

    selecting = since is not None or from_model is not None or bool(tags) or limit is not None
    if bool(ids) == selecting:
        raise click.UsageError(
            "give exchange IDs, or select with --since/--from-model/--tag/--limit"
        )
    filters = scan_filters(since, None, from_model, tags, limit or 10, True) if selecting else None
    options = replay_mod.ReplayOptions(
        model, upstream_name, stream, concurrency, api_key_env, allow_redacted
    )
    cfg = load_config(config_path, db_url=db_url)
    log_to_stderr("warning", timestamps=False)
    try:
        comparisons = asyncio.run(replay_mod.replay(cfg, list(ids), options, filters=filters))
    except replay_mod.ReplayError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        print_json(comparisons)
    else:
        click.echo(replay_mod.render(comparisons))
    if any(c["outcome"] != "ok" for c in comparisons):
        raise SystemExit(1)


@main.command()
@config_option
@click.option("--host", default=None, help="Address to listen on (default 127.0.0.1).")
@click.option("--port", default=None, type=int, help="Port to listen on (default 8080).")
@click.option(
    "--match",
    "ignore_fields",
    default="exact",
    show_default=True,
    callback=parse_with(_parse_match),
    help="exact, or ignore-fields=F,G: body fields (dotted paths) left out of the match.",
)
@click.option(
    "--miss",
    type=click.Choice(["error", "forward"]),
    default="error",
    show_default=True,
    help="No recorded match: an OpenAI-shaped 404, or forward upstream and record.",
)
@click.option(
    "--timing",
    type=click.Choice(["recorded", "fast"]),
    default="fast",
    show_default=True,
    help="Streams at their recorded pace, or at once.",
)
@click.option(
    "--errors",
    is_flag=True,
    help="Also play back recorded upstream errors (429, 500), in the order they came.",
)
@click.option("--upstream", default=None, help="Base URL of the first upstream (--miss forward).")
@db_option
@user_errors
def playback(
    config_path: str | None,
    host: str | None,
    port: int | None,
    ignore_fields: tuple[str, ...],
    miss: Any,
    timing: Any,
    errors: bool,
    upstream: str | None,
    db_url: str | None,
) -> None:
    """Serve recorded responses as a deterministic mock upstream."""
    from proxy.tools import playback as playback_mod

    cfg = load_config(config_path, host=host, port=port, upstream=upstream, db_url=db_url)
    log_to_stderr(cfg.log_level)
    options = playback_mod.PlaybackOptions(ignore_fields, miss, timing, errors)
    asyncio.run(playback_mod.run(cfg, options))


for _command in (
    cli_store.db,
    cli_store.logs,
    cli_store.show,
    cli_store.cost,
    cli_store.export,
    cli_store.prune,
    alerts,
):
    main.add_command(_command)
