"""The `flightrec` command line. Thin: each command parses flags and calls into the modules.

Every error a user can cause (bad config, unknown id, unreachable database) becomes one line on
stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import click
from click.exceptions import NoArgsIsHelpError

from . import config as config_mod
from .config import Config, ConfigError
from .logs import log_to_stderr

F = TypeVar("F", bound=Callable[..., Any])


def config_option(func: F) -> F:
    """`--config F` on every command (falls back to FLIGHTREC_CONFIG)."""
    return click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False),
        default=None,
        help="TOML config file (default: $FLIGHTREC_CONFIG).",
    )(func)


def db_option(func: F) -> F:
    """`--db URL`, the flag for the `db_url` key, named as `config.flag` names it in errors."""
    option = click.option(config_mod.flag("db_url"), "db_url", default=None, help="Database URL.")
    return option(func)


def load_config(config_path: str | None, **overrides: Any) -> Config:
    try:
        return config_mod.load(config_path, overrides=overrides)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def user_errors(func: F) -> F:
    """Turn the errors a user can cause into one clear line and exit status 1."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except click.ClickException:
            raise
        except (ConfigError, OSError) as exc:
            raise click.ClickException(str(exc)) from None
        except Exception as exc:
            from .store import StoreError

            if isinstance(exc, StoreError):
                raise click.ClickException(str(exc)) from None
            raise

    return wrapper  # type: ignore[return-value]


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
@user_errors
def serve(
    config_path: str | None,
    host: str | None,
    port: int | None,
    upstream: str | None,
    db_url: str | None,
    workers: int | None,
) -> None:
    """Run the proxy."""
    cfg = load_config(
        config_path, host=host, port=port, upstream=upstream, db_url=db_url, workers=workers
    )
    from .console.auth import check_bind

    check_bind(cfg.console_host if cfg.console_port else "127.0.0.1", cfg.console_token)
    log_to_stderr(cfg.log_level)
    if cfg.workers > 1:
        from .workers import supervise

        raise SystemExit(supervise(cfg))
    from .app import run  # keep `flightrec logs` from importing aiohttp's server

    asyncio.run(run(cfg))


@main.command()
@config_option
@click.option("--host", default=None, help="Address to listen on (default 127.0.0.1).")
@click.option("--port", default=None, type=int, help="Port to listen on (default 8081).")
@click.option("--db", "db_url", default=None, help="Database URL.")
@user_errors
def console(
    config_path: str | None, host: str | None, port: int | None, db_url: str | None
) -> None:
    """Serve the console (pages and JSON API) alone, against a database."""
    cfg = load_config(config_path, console_host=host, console_port=port, db_url=db_url)
    from .console import check_bind, run_console

    check_bind(cfg.console_host, cfg.console_token)
    log_to_stderr(cfg.log_level)
    asyncio.run(run_console(cfg))


# --- Database commands: `db upgrade`, `logs`, `show` (thin; the work is in proxy/store) ---


def _parse_with(
    parse: Callable[[str], Any],
) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback turning the store's ValueError into a usage error naming the flag."""

    def callback(_ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        if value is None:
            return None
        try:
            return [parse(v) for v in value] if isinstance(value, tuple) else parse(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None

    return callback


def _print_json(value: Any) -> None:
    import orjson

    click.echo(orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode())


@main.group()
def db() -> None:
    """Manage the database schema."""


@db.command("upgrade")
@config_option
@db_option
@user_errors
def db_upgrade(config_path: str | None, db_url: str | None) -> None:
    """Migrate the database to the newest schema."""
    from .store.engine import safe_url
    from .store.migrate import head, upgrade

    cfg = load_config(config_path, db_url=db_url)
    asyncio.run(upgrade(cfg.db_url))
    click.echo(f"{safe_url(cfg.db_url)}: schema at {head()}")


def _parse_tag(value: str) -> tuple[str, str]:
    from .store.read import parse_tag

    return parse_tag(value)


def _parse_since(value: str) -> Any:
    from .store.read import parse_since

    return parse_since(value)


# The selection options several commands share, declared once.
since_option = click.option(
    "--since",
    default=None,
    callback=_parse_with(_parse_since),
    help="Only exchanges since T: 15m, 2h, 7d, or an ISO date/time (local if no zone).",
)
until_option = click.option(
    "--until",
    default=None,
    callback=_parse_with(_parse_since),
    help="Only exchanges before T (same forms as --since).",
)
tag_option = click.option(
    "--tag",
    "tags",
    multiple=True,
    callback=_parse_with(_parse_tag),
    help="Only exchanges with tag k=v (repeatable; all must match).",
)


@main.command()
@config_option
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=1))
@click.option("--model", default=None, help="Only exchanges that requested or got this model.")
@since_option
@tag_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@user_errors
def logs(
    config_path: str | None,
    limit: int,
    model: str | None,
    since: Any,
    tags: list[tuple[str, str]],
    as_json: bool,
) -> None:
    """Recent exchanges, newest first."""
    from .store import read

    cfg = load_config(config_path)

    async def fetch() -> list[dict[str, Any]]:
        async with read.reading(cfg.db_url) as engine:
            return await read.list_exchanges(
                engine, limit=limit, model=model, since=since, tags=list(tags)
            )

    found = asyncio.run(fetch())
    if as_json:
        _print_json(found)
    else:
        click.echo(read.render_table(found))


@main.command()
@config_option
@click.argument("exchange_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="Print the exchange as one JSON object.")
@user_errors
def show(config_path: str | None, exchange_id: str, as_json: bool) -> None:
    """One exchange in full (ID or a unique prefix of at least 8 characters)."""
    from .store import read

    cfg = load_config(config_path)

    async def fetch() -> dict[str, Any]:
        async with read.reading(cfg.db_url) as engine:
            return await read.get_exchange(engine, exchange_id)

    shown = asyncio.run(fetch())
    if as_json:
        _print_json(shown)
    else:
        click.echo(read.render_exchange(shown))


# --- `cost`: the spend report (thin; the SQL is in proxy/store/report.py) ---


def _parse_by(value: str) -> str:
    from .store.report import parse_by

    return parse_by(value)


@main.command()
@config_option
@click.option(
    "--by",
    default="model",
    show_default=True,
    callback=_parse_with(_parse_by),
    help="Group by model, key, user, tag:<key>, day (UTC) or upstream.",
)
@since_option
@until_option
@click.option("--model", default=None, help="Only exchanges that requested or got this model.")
@click.option("--key", default=None, help="Only this API key: its hint (sk-...a1b2) or hash.")
@tag_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
)
@click.option(
    "--reprice",
    is_flag=True,
    help="First recompute the stored costs with today's prices (shipped table + config).",
)
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
) -> None:
    """Spend per model, key, user, tag, day or upstream, with a total."""
    from .pricing import PriceTable
    from .store import read, report
    from .store.filters import Filters

    cfg = load_config(config_path)
    if since is not None and until is not None and since >= until:
        raise click.UsageError("--since must be earlier than --until")
    filters = Filters(since, until, model, key, tuple(tags))

    async def run() -> tuple[report.Repriced | None, list[dict[str, Any]]]:
        async with read.reading(cfg.db_url) as engine:
            repriced = None
            if reprice:
                repriced = await report.reprice(engine, PriceTable.load(cfg.prices), filters)
            return repriced, await report.cost_report(engine, by, filters)

    repriced, rows = asyncio.run(run())
    if repriced is not None:
        click.echo(f"repriced {repriced.seen} exchanges: {repriced.changed} changed", err=True)
    if fmt == "json":
        _print_json(report.as_json(rows))
    elif fmt == "csv":
        click.echo(report.as_csv(rows, by), nl=False)
    else:
        click.echo(report.as_table(rows, by))


# --- `replay`, `playback`, `export` (thin; the work is in proxy/replay.py, proxy/playback.py
# and proxy/export.py) ---


def _parse_match(value: str) -> tuple[str, ...]:
    """`exact`, or `ignore-fields=F,G` (also `ignore-fields:F,G` or `ignore-fields F,G`)."""
    if value == "exact":
        return ()
    name, sep, fields = value[:13], value[13:14], value[14:]
    found = tuple(f.strip() for f in fields.split(",") if f.strip())
    if name != "ignore-fields" or sep not in ("=", ":", " ") or not found:
        raise ValueError(f"expected exact or ignore-fields=F,G,... got {value!r}")
    return found


def _filters(
    since: Any,
    until: Any,
    model: str | None,
    tags: list[tuple[str, str]],
    limit: int | None,
    originals_only: bool = False,
) -> Any:
    from .store.filters import Filters

    if since is not None and until is not None and since >= until:
        raise click.UsageError("--since must be earlier than --until")
    return Filters(
        since, until, requested_model=model, tags=tuple(tags), limit=limit,
        originals_only=originals_only,
    )  # fmt: skip


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
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of comparisons.")
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
    as_json: bool,
) -> None:
    """Re-send recorded requests through the proxy, record them, compare with the originals.

    Give exchange IDs, or select instead with --since, --from-model and --tag (the newest
    --limit). Exit status 1 when a replay did not succeed (its failure is recorded and shown)."""
    from . import replay as replay_mod

    selecting = since is not None or from_model is not None or bool(tags) or limit is not None
    if bool(ids) == selecting:
        raise click.UsageError(
            "give exchange IDs, or select with --since/--from-model/--tag/--limit"
        )
    filters = _filters(since, None, from_model, tags, limit or 10, True) if selecting else None
    options = replay_mod.ReplayOptions(model, upstream_name, stream, concurrency, api_key_env)
    cfg = load_config(config_path)
    log_to_stderr("warning", timestamps=False)
    try:
        comparisons = asyncio.run(replay_mod.replay(cfg, list(ids), options, filters=filters))
    except replay_mod.ReplayError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        _print_json(comparisons)
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
    callback=_parse_with(_parse_match),
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
    upstream: str | None,
    db_url: str | None,
) -> None:
    """Serve recorded responses as a deterministic mock upstream."""
    from . import playback as playback_mod

    cfg = load_config(config_path, host=host, port=port, upstream=upstream, db_url=db_url)
    log_to_stderr(cfg.log_level)
    options = playback_mod.PlaybackOptions(ignore_fields, miss, timing)
    asyncio.run(playback_mod.run(cfg, options))


@main.command()
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
) -> None:
    """Export exchanges, oldest first: JSONL, CSV, HAR 1.2 or OpenAI Batch API input."""
    import sys

    from . import export as export_mod
    from .store import read

    if endpoint not in export_mod.BATCH_ENDPOINTS:
        raise click.BadParameter(
            f"expected one of {', '.join(export_mod.BATCH_ENDPOINTS)}", param_hint="--endpoint"
        )
    filters = _filters(since, until, model, tags, limit)
    cfg = load_config(config_path)

    async def run(write: export_mod.Write) -> int:
        async with read.reading(cfg.db_url) as engine:
            return await export_mod.export(
                engine, write, fmt, filters, upstreams=cfg.upstreams, endpoint=endpoint
            )

    with contextlib.ExitStack() as stack:
        out = sys.stdout.buffer if output is None else stack.enter_context(open(output, "wb"))
        count = asyncio.run(run(out.write))
        out.flush()
    if output is not None:
        click.echo(f"exported {count} exchanges to {output}", err=True)
