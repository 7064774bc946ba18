"""JSON text as flightrec writes it: the store's JSON columns, bodies that redaction changed."""

from __future__ import annotations

import json
from typing import Any

import orjson


def dumps(value: Any) -> str:
    """JSON text; stdlib fallback for what orjson refuses (ints beyond 64 bits)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return json.dumps(value, default=str)
