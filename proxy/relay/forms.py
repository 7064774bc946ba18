"""The text fields of a `multipart/form-data` request body (RFC 7578), for the record.

An upload (`/audio/transcriptions`, `/audio/translations`, `/images/edits`) names its model in
a form field, not in JSON. Pure, and safe on any bytes: a body that is not a form, or a field
that is not short UTF-8 text, gives fewer fields, never an error.
"""

from __future__ import annotations

import contextlib
import re

FORM_KEYS = ("model", "stream", "user")
"""The form fields the record reads, as it reads these keys of a JSON body."""
MAX_FIELD_BYTES = 1024
"""Longer values are not what the record reads from a form (a model name, a flag)."""
_MAX_BOUNDARY = 200  # RFC 2046 allows 70; a longer one is not a form boundary
_NAME = re.compile(rb'(?:^|;)\s*name\s*=\s*(?:"([^"]*)"|([^;\s]+))', re.IGNORECASE)
_FILENAME = re.compile(rb";\s*filename\*?\s*=", re.IGNORECASE)


def _boundary(content_type: str) -> bytes | None:
    """The boundary of a `multipart/form-data` Content-Type; None for any other type."""
    kind, _, params = content_type.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        return None
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "boundary":
            value = value.strip().strip('"')
            if 0 < len(value) <= _MAX_BOUNDARY and value.isascii():
                return value.encode()
    return None


def form_fields(body: bytes, content_type: str, names: tuple[str, ...]) -> dict[str, str]:
    """The fields in `names` that `body` carries as text (not as files), the first of each;
    it stops reading once it has them all."""
    boundary = _boundary(content_type)
    if boundary is None:
        return {}
    wanted = {name.encode(): name for name in names}
    found: dict[str, str] = {}
    delimiter = b"\r\n--" + boundary
    # The first delimiter may open the body without the CRLF in front of it.
    at = 0 if body.startswith(delimiter[2:]) else body.find(delimiter)
    start = -1 if at == -1 else at + (len(delimiter) - 2 if at == 0 else len(delimiter))
    while start != -1 and len(found) < len(wanted) and body[start : start + 2] != b"--":
        end = body.find(delimiter, start)
        head_end = body.find(b"\r\n\r\n", start, len(body) if end == -1 else end)
        if head_end != -1:
            name = _field_name(body[start:head_end])
            value = body[head_end + 4 : len(body) if end == -1 else end]
            if name in wanted and wanted[name] not in found and len(value) <= MAX_FIELD_BYTES:
                with contextlib.suppress(UnicodeDecodeError):
                    found[wanted[name]] = value.decode()
        start = -1 if end == -1 else end + len(delimiter)
    return found


def _field_name(head: bytes) -> bytes | None:
    """The `name` of a part whose headers are `head`; None for a file or no form field."""
    for line in head.split(b"\r\n"):
        header, _, value = line.partition(b":")
        if header.strip().lower() == b"content-disposition":
            if _FILENAME.search(value):
                return None
            kind, _, params = value.partition(b";")
            match = _NAME.search(b";" + params)
            if kind.strip().lower() != b"form-data" or match is None:
                return None
            return match.group(1) if match.group(1) is not None else match.group(2)
    return None
