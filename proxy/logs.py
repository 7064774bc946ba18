"""The one place a flightrec process sets up its log: on stderr, one line a record."""

from __future__ import annotations

import logging


def log_to_stderr(level: str, *, prefix: str = "", timestamps: bool = True) -> None:
    """Log at `level` and above to stderr; `prefix` names the process (a worker's number)."""
    stamp = "%(asctime)s " if timestamps else ""
    logging.basicConfig(
        level=level.upper(), format=f"{stamp}%(levelname)s {prefix}%(name)s: %(message)s"
    )
    # alembic announces each of its plugins at info level on every start: noise in our log.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
