"""The store: schema, migrations, writing exchanges to rows and reading them back.

`tables` declares the schema, `migrate` applies it with alembic, `write` turns exchanges into
rows, `read` turns rows back into the `show --json` shape, `journal` holds every record on
local disk until the database has it. The background writer that ties them together is
`proxy.dbrecorder`.
"""

from .engine import StoreError, check_connection, create_engine
from .migrate import downgrade, upgrade

__all__ = ["StoreError", "check_connection", "create_engine", "downgrade", "upgrade"]
