"""The `flightrec` command line. Thin: each command parses flags and calls into the modules.

Every error a user can cause (bad config, unknown id, unreachable database) becomes one line on
stderr and exit status 1, never a traceback.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import click

from . import config as config_mod
from .config import Config, ConfigError

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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="flightrec")
def main() -> None:
    """flightrec: a logging reverse proxy for OpenAI-compatible APIs."""


@main.command()
@config_option
@click.option("--host", default=None, help="Address to listen on (default 127.0.0.1).")
@click.option("--port", default=None, type=int, help="Port to listen on (default 8080).")
@click.option("--upstream", default=None, help="Base URL of the first upstream.")
@click.option("--db", "db_url", default=None, help="Database URL.")
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
    logging.basicConfig(
        level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if cfg.workers > 1:
        from .workers import supervise

        raise SystemExit(supervise(cfg))
    from .app import run  # keep `flightrec logs` from importing aiohttp's server

    asyncio.run(run(cfg))


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
@click.option("--db", "db_url", default=None, help="Database URL.")
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


@main.command()
@config_option
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=1))
@click.option("--model", default=None, help="Only exchanges that requested this model.")
@click.option(
    "--since",
    default=None,
    callback=_parse_with(_parse_since),
    help="Only exchanges since T: 15m, 2h, 7d, or an ISO date/time (local if no zone).",
)
@click.option(
    "--tag",
    "tags",
    multiple=True,
    callback=_parse_with(_parse_tag),
    help="Only exchanges with tag k=v (repeatable; all must match).",
)
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
