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
@user_errors
def serve(
    config_path: str | None,
    host: str | None,
    port: int | None,
    upstream: str | None,
    db_url: str | None,
) -> None:
    """Run the proxy."""
    from .app import run

    cfg = load_config(config_path, host=host, port=port, upstream=upstream, db_url=db_url)
    logging.basicConfig(
        level=cfg.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    asyncio.run(run(cfg))
