"""Telling a record the database refuses from a database that is not there.

A refused record (a constraint, a value the driver cannot encode) is set aside so that it
cannot block the records behind it; anything else is an outage, and the batch is tried again.
"""

from __future__ import annotations

import sqlite3

import sqlalchemy as sa


def refuses_record(exc: BaseException) -> bool:
    """True when the failure is about the data written, not about the database being there."""
    seen: BaseException | None = exc
    while seen is not None:
        # ValueError: a value the driver cannot encode (a lone surrogate); TypeError: odd types;
        # sqlite3 raises ProgrammingError for a value it cannot bind, OverflowError for an int
        # beyond 64 bits.
        if isinstance(
            seen,
            sa.exc.IntegrityError
            | sa.exc.DataError
            | sqlite3.IntegrityError
            | sqlite3.DataError
            | sqlite3.ProgrammingError
            | sqlite3.InterfaceError
            | OverflowError
            | ValueError
            | TypeError,
        ):
            return True
        seen = seen.__cause__ or (seen.orig if isinstance(seen, sa.exc.DBAPIError) else None)
    # A StatementError that is not a DBAPIError failed while binding parameters: our values.
    return isinstance(exc, sa.exc.StatementError) and not isinstance(exc, sa.exc.DBAPIError)
