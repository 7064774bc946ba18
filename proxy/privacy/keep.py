"""What the record keeps of an exchange: the one step between a finished exchange and the sinks.

`Sinks.accept` runs `Keep` before any sink sees the exchange, so the database, the journal,
metrics and traces all get the same record: bodies the client asked to omit
(`X-Flightrec-Omit`) or `store_bodies = "metadata"` keeps out are gone, and the `[[redact]]`
rules have run (`redact.py`), the record noting in `redacted` which matched. This runs when the
record is completed (`record.conclude`, deferred by `Deferred`), never on the relay's path; with
no rules and full bodies it only clears what the client asked to omit.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from proxy.exchange import Exchange
from proxy.privacy.pseudonym import Pseudonyms
from proxy.privacy.redact import Hits, Redactor, RedactRule
from proxy.text import dumps

log = logging.getLogger(__name__)


class KeepSettings(Protocol):
    """What `Keep` reads of the configuration (`proxy.config.Config` has both)."""

    @property
    def store_bodies(self) -> str: ...

    @property
    def redact(self) -> tuple[RedactRule, ...]: ...

    @property
    def pseudonym_key(self) -> str | None: ...

    @property
    def spool_path(self) -> str: ...


class Keep:
    def __init__(self, settings: KeepSettings | None = None) -> None:
        self._metadata = settings is not None and settings.store_bodies == "metadata"
        self.redactor = None if settings is None else redactor_for(settings)
        """None when no rule is configured: nothing is searched."""

    def __call__(self, ex: Exchange) -> None:
        if self._metadata:
            ex.omit_request = ex.omit_response = True
        if ex.omit_request:
            ex.request_body = ex.request_json = None
        if ex.omit_response:
            ex.response_body = ex.response_json = ex.raw_stream_gz = ex.raw_pacing = None
        if self.redactor is None:
            return
        try:
            redact_exchange(self.redactor, ex)
        except Exception:  # a bug must cost the bodies, never leak them or lose the record
            log.exception("exchange %s: redaction failed; its bodies are not kept", ex.id)
            failed(ex)


def failed(ex: Exchange) -> None:
    """Clear what a rule could have matched, in place, when redaction did not finish: the
    record keeps its timings, usage and cost, and a note saying so."""
    ex.omit_request = ex.omit_response = True
    ex.request_body = ex.request_json = None
    ex.response_body = ex.response_json = ex.raw_stream_gz = ex.raw_pacing = None
    ex.error, ex.query, ex.user, ex.parse_errors, ex.tags = None, "", None, [], {}
    ex.path, ex.upstream_url = "[REDACTION FAILED]", ""  # a path can hold a secret
    ex.model = ex.response_model = ex.system_fingerprint = None
    ex.upstream_request_id = ex.content_type = None
    ex.redacted = {"rules": [], "failed": True}


def redactor_for(settings: KeepSettings) -> Redactor | None:
    """The rules, identifiers getting pseudonyms (`pseudonym.py`); None without rules."""
    if not settings.redact:
        return None
    return Redactor(settings.redact, Pseudonyms(settings.pseudonym_key, settings.spool_path))


IDENTIFIERS = ("user", "safety_identifier")
"""Request fields that name the end user: matches in them get pseudonyms, not one fixed
replacement, so users stay apart (`cost --by user`)."""


def _identifiers(redactor: Redactor, request: Any, hits: Hits) -> None:
    """The identifiers of a request's JSON redacted in place, before the rest."""
    if isinstance(request, dict):
        for name in IDENTIFIERS:
            if isinstance(request.get(name), str):
                request[name] = redactor.identifier(request[name], hits)


def redact_exchange(redactor: Redactor, ex: Exchange) -> None:
    """Every text of the exchange that can hold what a rule matches, redacted in place."""
    hits: Hits = set()
    _identifiers(redactor, ex.request_json, hits)
    ex.request_json, ex.request_body = _body(
        redactor, ex.request_json, ex.request_body, hits, changed=bool(hits)
    )
    answer: Hits = set()
    response, dropped = redactor.answer(
        ex.response_body if ex.response_json is None else ex.response_json,
        ex.raw_stream_gz,
        answer,
    )
    if ex.response_json is None:
        ex.response_body = response
    elif answer and ex.response_body is not None:  # the stored text must be the JSON's
        ex.response_body = dumps(response).encode()
    if "raw_stream" in dropped:
        ex.raw_stream_gz = ex.raw_pacing = None
    hits |= answer
    for name in TEXTS:
        redact = redactor.identifier if name == "user" else redactor.value
        setattr(ex, name, redact(getattr(ex, name), hits))
    if hits:
        ex.redacted = noted(hits, dropped)


TEXTS = (
    "error", "query", "path", "upstream_url", "user", "parse_errors", "tags", "model",
    "response_model", "system_fingerprint", "upstream_request_id", "content_type",
)  # fmt: skip
"""What else of an exchange (or its `show --json` record) may hold what a rule matches: all
the client or the upstream chose."""


def redact_record(redactor: Redactor, record: dict[str, Any]) -> None:
    """A `show --json` record (`export`) redacted in place, as `redact_exchange` redacts an
    exchange: records stored before a rule existed come out clean."""
    hits: Hits = set()
    _identifiers(redactor, record["request"], hits)
    record["request"] = redactor.value(record["request"], hits)
    answer: Hits = set()
    record["response"], dropped = redactor.answer(
        record["response"], record.get("raw_stream"), answer
    )
    if "raw_stream" in dropped:
        record["raw_stream"] = None
    hits |= answer
    for name in TEXTS:
        redact = redactor.identifier if name == "user" else redactor.value
        record[name] = redact(record[name], hits)
    if hits:
        earlier = record.get("redacted") or {}
        rules = hits | set(earlier.get("rules") or ())
        dropped = [*(earlier.get("dropped") or ()), *dropped]
        record["redacted"] = noted(rules, sorted(set(dropped)))


def _body(
    redactor: Redactor, parsed: Any, raw: bytes | None, hits: Hits, changed: bool = False
) -> tuple[Any, Any]:
    """A body's JSON and bytes redacted; the bytes are the JSON's text again when it changed
    (`changed`: already, its identifiers)."""
    if parsed is None:
        return None, None if raw is None else redactor.data(raw, hits)
    found: Hits = set()
    parsed = redactor.value(parsed, found)
    if (found or changed) and raw is not None:
        raw = dumps(parsed).encode()
    hits |= found
    return parsed, raw


def noted(hits: Hits, dropped: list[str]) -> dict[str, Any]:
    """What the record's `redacted` says: the rules that matched, what was not kept."""
    note: dict[str, Any] = {"rules": sorted(hits)}
    if dropped:
        note["dropped"] = dropped
    return note
