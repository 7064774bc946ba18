"""Stable pseudonyms for identifiers a `[[redact]]` rule matches.

An exchange's `user` (`X-Flightrec-User`, or the request's `user` / `safety_identifier`) is an
identifier: replaced by one fixed `[REDACTED:email]`, every user would become one in
`cost --by user` and the metrics' `user` label. So what a rule matches in an identifier is
replaced by `[<rule>:<pseudonym>]` instead, the pseudonym the first 12 hex digits of an
HMAC-SHA256 of the match under a secret key: the same address always gives the same
pseudonym, different addresses different ones, and without the key nobody can test a guess.

The key is `pseudonym_key` when set (give every instance sharing a database the same one);
else a random key generated once and kept in `flightrec.key` (mode 0600) in the journal's
directory, so `serve --workers N` and later starts agree.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
from pathlib import Path

KEY_FILE = "flightrec.key"
DIGITS = 12
"""Hex digits of a pseudonym: 48 bits, no collision among millions of identifiers."""


class Pseudonyms:
    """The pseudonym function of `Redactor`; the key is read (or made) when first needed."""

    def __init__(self, configured: str | None, spool_path: str) -> None:
        self._configured = configured
        self._spool_path = spool_path
        self._key: bytes | None = None

    def __call__(self, rule: str, matched: str) -> str:
        if self._key is None:
            self._key = load_key(self._configured, self._spool_path)
        digest = hmac.new(self._key, matched.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return f"[{rule}:{digest.hexdigest()[:DIGITS]}]"


def key_path(spool_path: str) -> Path:
    """Where the generated key lives: beside the journal."""
    return Path(spool_path).parent / KEY_FILE


def load_key(configured: str | None, spool_path: str) -> bytes:
    """`configured`, else the key kept beside the journal (made on first use)."""
    if configured:
        return configured.encode()
    path = key_path(spool_path)
    with contextlib.suppress(FileNotFoundError):
        return path.read_bytes().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written whole under a name of its own, then linked into place: a process that finds the
    # file finds the whole key, and of two making it at once (workers) one key wins.
    made = path.with_name(f".{KEY_FILE}.{os.getpid()}")
    fd = os.open(made, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_hex(32).encode())
    try:
        os.link(made, path)
    except FileExistsError:
        pass
    finally:
        made.unlink()
    return path.read_bytes().strip()
