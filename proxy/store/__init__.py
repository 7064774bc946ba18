"""The store: schema, migrations, writing exchanges to rows and reading them back.

`tables` declares the schema, `migrate` applies it with alembic, `rows` turns exchanges into
rows by column name, `sqlite_writer` and `pg_writer` write them (`writer` picks one),
`read` turns rows back into the `show --json` shape, `journal` holds every record on local
disk until the database has it and `backlog` feeds it to the writer. The background writer
that ties them together is `proxy.store.recorder`.
"""

from proxy.store.engine import (
    StoreError,
    Unreachable,
    check_connection,
    check_writable,
    create_engine,
)
from proxy.store.migrate import downgrade, upgrade

__all__ = [
    "StoreError",
    "Unreachable",
    "check_connection",
    "check_writable",
    "create_engine",
    "downgrade",
    "upgrade",
]
