"""Recorded text written out: as JSON, on a terminal, in a spreadsheet.

JSON text as flightrec writes it: the store's JSON columns, bodies that redaction changed.

Recorded text made safe to print on a terminal.

A model name, user, tag, error or body is whatever a client or upstream sent; printed raw, an
ESC or C1 control in it is obeyed by the terminal (OSC 52 writes the clipboard, OSC 0 the
title, CSI moves the cursor). click strips colour codes only when output is not a terminal,
and never OSC. Every CLI line or table that shows recorded text goes through `printable`,
and `--json` output through `json_printable`.

A CSV cell that a spreadsheet would read as a formula goes behind a `'` (`spreadsheet_text`).
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def json_bytes(value: Any) -> bytes:
    """JSON as bytes; stdlib fallback for what orjson refuses (ints beyond 64 bits).

    Every record's journal line and every value of the store's JSON columns (two a logprob
    token) goes through here, and nearly every one has text keys only: orjson's plain path
    first, `OPT_NON_STR_KEYS` (which has it look at each key's type) only for a value that
    has others."""
    try:
        return orjson.dumps(value)
    except TypeError:
        pass
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return json.dumps(value, default=str).encode()


def dumps(value: Any) -> str:
    """`json_bytes` as text."""
    return json_bytes(value).decode()


_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]
"""C0, DEL and C1: what a terminal may act on."""
_LINES = str.maketrans({c: f"\\x{c:02x}" for c in _CONTROLS if chr(c) not in "\n\t"})
_CELLS = str.maketrans({c: f"\\x{c:02x}" for c in _CONTROLS})


def printable(text: str, *, cell: bool = False) -> str:
    """`text` with every control character shown as a visible escape (`\\x1b`), except line
    feeds and tabs outside table cells (`cell`), where they would break the columns."""
    return text.translate(_CELLS if cell else _LINES)


_JSON = str.maketrans({c: f"\\u{c:04x}" for c in [0x7F, *range(0x80, 0xA0)]})


def json_printable(encoded: str) -> str:
    """JSON text with DEL and C1 escaped too (orjson escapes only C0); such characters can
    only stand inside JSON strings, where the escape means the same."""
    return encoded.translate(_JSON)


_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_text(text: str) -> str:
    """A recorded text as a CSV cell: behind a `'` when a spreadsheet would read it as a
    formula (`=HYPERLINK(...)`), as OWASP's CSV injection rule says. Numbers are not text."""
    return "'" + text if text.startswith(_FORMULA_START) else text
