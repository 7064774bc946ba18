"""What the `flightrec` commands share: the common flags, config loading, one-line errors.

Kept apart from the commands so `proxy/cli/main.py` (serving) and `proxy/cli/store.py` (database
commands) both use the same declarations.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable, Collection, Mapping
from typing import Any, NoReturn, TypeVar

import click

from proxy import config as config_mod
from proxy.config import Config, ConfigError

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


def load_config(
    config_path: str | None,
    flags: Mapping[str, str] | None = None,
    *,
    uses: Collection[str] | None = None,
    **overrides: Any,
) -> Config:
    """The config, with `overrides` from flags; `flags` names a key's flag where this
    command's differs from `config.flag(key)`, so errors name what the user typed. `uses`:
    the keys the command uses, the only ones checked (`config.load`)."""
    try:
        return config_mod.load(config_path, overrides=overrides, flags=flags, uses=uses)
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
        except BrokenPipeError:
            _closed_pipe()
        except (ConfigError, OSError) as exc:
            raise click.ClickException(str(exc)) from None
        except Exception as exc:
            from proxy.store import StoreError

            if isinstance(exc, StoreError):
                raise click.ClickException(str(exc)) from None
            raise

    return wrapper  # type: ignore[return-value]


def _closed_pipe() -> NoReturn:
    """The reader of our output went away (`flightrec logs | head -1`): end quietly, with the
    status a process killed by SIGPIPE has, as other Unix tools do. What is still buffered for
    stdout goes nowhere, so the interpreter's own flush at exit says nothing either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    raise SystemExit(128 + signal.SIGPIPE)


def parse_with(
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


def print_json(value: Any) -> None:
    import orjson

    from proxy.text import json_printable

    encoded = orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS)
    click.echo(json_printable(encoded.decode()))


def _parse_tag(value: str) -> tuple[str, str]:
    from proxy.store.read import parse_tag

    return parse_tag(value)


def _parse_since(value: str) -> Any:
    from proxy.store.read import parse_since

    return parse_since(value)


# The selection options several commands share, declared once.
since_option = click.option(
    "--since",
    default=None,
    callback=parse_with(_parse_since),
    help="Only exchanges since T: 15m, 2h, 7d, or an ISO date/time (local if no zone).",
)
until_option = click.option(
    "--until",
    default=None,
    callback=parse_with(_parse_since),
    help="Only exchanges before T (same forms as --since).",
)
tag_option = click.option(
    "--tag",
    "tags",
    multiple=True,
    callback=parse_with(_parse_tag),
    help="Only exchanges with tag k=v (repeatable; all must match).",
)


def scan_filters(
    since: Any,
    until: Any,
    model: str | None,
    tags: list[tuple[str, str]],
    limit: int | None,
    originals_only: bool = False,
) -> Any:
    from proxy.store.filters import Filters

    if since is not None and until is not None and since >= until:
        raise click.UsageError("--since must be earlier than --until")
    return Filters(
        since, until, requested_model=model, tags=tuple(tags), limit=limit,
        originals_only=originals_only,
    )  # fmt: skip
