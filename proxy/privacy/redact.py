"""Redaction: `[[redact]]` rules that keep secrets and personal data out of every record.

A rule is a named preset (`PRESETS`) or a Python regular expression, and the literal text
that replaces what it matches (default `[REDACTED:<name>]`). Rules run in the order given,
over the record as it is made (`keep.py`, before any sink) and over what `export` writes, so
an exchange stored before a rule existed comes out clean too. The client's bytes are never
touched: the record is redacted after the exchange ended.

JSON is redacted string by string (keys too, each number as its text), after parsing, so an
escape (`\\u0040`) cannot hide a match and the JSON stays valid; a string that is itself JSON
(tool-call `arguments`) is parsed and walked the same way. A rule never matches across JSON
structure (a key and its value): it sees one key, string or number at a time. Raw bodies
are redacted as UTF-8 text, byte for byte elsewhere. What cannot be redacted faithfully is
dropped: when any rule matched in the answer (or in a stream's raw bytes), the stream's raw
bytes and the answer's logprobs are not kept, since a secret split across SSE events or
tokens matches in neither.
"""

from __future__ import annotations

import gzip
import importlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.privacy.presets import CHECKS, DIGITS, HINTS, PRESETS, card_spans, digit_count, luhn
from proxy.text import dumps

__all__ = ["PRESETS", "Hits", "RedactRule", "Redactor", "luhn", "parse_rules"]


@dataclass(frozen=True, slots=True)
class RedactRule:
    """One `[[redact]]` rule as configured (checked by `parse_rules`)."""

    name: str
    pattern: str
    """The regular expression: the preset's, or the rule's own."""
    replace: str
    preset: str | None = None


def parse_rules(raw: Any, error: Callable[[str], Exception]) -> tuple[RedactRule, ...]:
    """The `[[redact]]` tables; each problem raises `error(message)` naming the rule's index."""
    if not isinstance(raw, list):
        raise error("redact: expected an array of tables ([[redact]])")
    rules: list[RedactRule] = []
    for at, entry in enumerate(raw):
        rule = _rule(f"redact[{at}]", entry, error)
        if any(known.name == rule.name for known in rules):
            raise error(f"redact[{at}].name: {rule.name!r} names another rule already")
        rules.append(rule)
    return tuple(rules)


def _rule(where: str, entry: Any, error: Callable[[str], Exception]) -> RedactRule:
    if not isinstance(entry, dict):
        raise error(f"{where}: expected a table")
    for key in entry:
        if key not in ("name", "preset", "pattern", "replace"):
            raise error(f"{where}.{key}: unknown key (known: name, preset, pattern, replace)")
    preset, pattern = entry.get("preset"), entry.get("pattern")
    if (preset is None) == (pattern is None):
        raise error(f"{where}: give either preset or pattern")
    if preset is not None:
        if not isinstance(preset, str) or preset not in PRESETS:
            raise error(f"{where}.preset: expected one of {', '.join(PRESETS)}, got {preset!r}")
        pattern = PRESETS[preset]
    elif not isinstance(pattern, str) or not pattern:
        raise error(f"{where}.pattern: expected a regular expression, got {pattern!r}")
    try:
        empty = re.compile(pattern).fullmatch("")
    except re.error as exc:
        raise error(f"{where}.pattern: not a valid regular expression: {exc}") from None
    if empty is not None:
        raise error(f"{where}.pattern: matches the empty string, so it would match everywhere")
    if _widths(pattern)[1] == 0:
        raise error(
            f"{where}.pattern: can only match an empty string (a lookaround, \\b), so it "
            "would never redact anything"
        )
    name = entry.get("name", preset or "pattern")
    if not isinstance(name, str) or not name:
        raise error(f"{where}.name: expected a non-empty string, got {name!r}")
    replace = entry.get("replace", f"[REDACTED:{name}]")
    if not isinstance(replace, str):
        raise error(f"{where}.replace: expected a string, got {replace!r}")
    return RedactRule(name, pattern, replace, preset)


def _widths(pattern: str) -> tuple[int, int]:
    """The fewest and the most characters a match of `pattern` can have, as far as CPython's
    own parser tells ((0, 1) when it cannot: another Python)."""
    try:
        parser: Any = importlib.import_module("re._parser")  # CPython's own, 3.11+
        low, high = parser.parse(pattern).getwidth()
        return int(low), int(high)
    except Exception:  # another Python: search everything, refuse nothing
        return 0, 1


def shortest(pattern: str) -> int:
    """The fewest characters a match of `pattern` can have (0 when that cannot be told):
    shorter texts (most logprob tokens) need not be searched (docs/performance.md,
    *Redaction*)."""
    return _widths(pattern)[0]


Spans = Callable[[str], Iterator[tuple[int, int]]]
"""Where a rule matches in a text: (start, end), in order, never empty."""


def _spans(regex: re.Pattern[str], check: Callable[[re.Match[str]], bool] | None) -> Spans:
    def spans(text: str) -> Iterator[tuple[int, int]]:
        for match in regex.finditer(text):
            if match.end() > match.start() and (check is None or check(match)):
                yield match.span()

    return spans


class _Compiled:
    __slots__ = ("digits", "hint", "name", "replace", "screens", "shortest", "spans")

    def __init__(self, rule: RedactRule) -> None:
        self.name = rule.name
        self.replace = rule.replace
        regex, preset = re.compile(rule.pattern), rule.preset or ""
        self.spans = card_spans if preset == "card" else _spans(regex, CHECKS.get(preset))
        self.hint = HINTS.get(preset)
        self.digits = DIGITS.get(preset, 0)
        self.shortest = shortest(rule.pattern)
        self.screens = rule.preset is not None
        """Whether a whole JSON value's text can be searched at once for this rule
        (`Redactor._candidates`): only for the presets, known not to lose a match by it (a
        pattern's anchors or lookarounds could)."""

    def hopeless(self, text: str) -> bool:
        """Whether `text` cannot hold a match, told without searching it."""
        if len(text) < self.shortest or (self.hint is not None and self.hint not in text):
            return True
        return self.digits > 0 and digit_count(text) < self.digits

    def found_in(self, text: str) -> bool:
        """Whether the rule matches somewhere in `text` (nothing is replaced)."""
        return not self.hopeless(text) and next(self.spans(text), None) is not None

    def apply(self, text: str, instead: Pseudonym | None = None) -> str | None:
        """`text` redacted (the replacement taken literally, or each match's pseudonym from
        `instead`); None when nothing matched. An empty match is never replaced: it holds
        nothing."""
        if self.hopeless(text):
            return None
        pieces: list[str] = []
        at = 0
        for start, end in self.spans(text):
            shown = self.replace if instead is None else instead(self.name, text[start:end])
            pieces += (text[at:start], shown)
            at = end
        if not pieces:
            return None
        pieces.append(text[at:])
        return "".join(pieces)


Hits = set[str]
"""Names of the rules that matched."""
Pseudonym = Callable[[str, str], str]
"""(rule name, matched text) -> what stands for it in an identifier (`pseudonym.py`)."""


class Redactor:
    """Compiled rules, applied to text, bytes and JSON values."""

    def __init__(self, rules: tuple[RedactRule, ...], pseudonym: Pseudonym | None = None) -> None:
        self._rules = tuple(_Compiled(rule) for rule in rules)
        self._shortest = min((rule.shortest for rule in self._rules), default=0)
        self._pseudonym = pseudonym

    def identifier(self, value: Any, hits: Hits) -> Any:
        """An identifier (a user id) redacted: each match by its pseudonym, so identifiers
        stay apart; as `value` without a pseudonym function."""
        if self._pseudonym is None or not isinstance(value, str):
            return self.value(value, hits)
        for rule in self._rules:
            out = rule.apply(value, self._pseudonym)
            if out is not None:
                hits.add(rule.name)
                value = out
        return value

    def text(self, text: str, hits: Hits, rules: tuple[_Compiled, ...] | None = None) -> str:
        """`text` redacted by `rules` (default all; the same object when nothing matched);
        names of the rules that matched added to `hits`."""
        if len(text) < self._shortest:
            return text
        if text[:1] in ("{", "[") and len(text) > 1:
            inner = _loads(text)
            if isinstance(inner, dict | list):
                found: Hits = set()
                self.walk(inner, found)
                if not found:
                    return text
                hits |= found
                return dumps(inner)
        for rule in self._rules if rules is None else rules:
            out = rule.apply(text)
            if out is not None:
                hits.add(rule.name)
                text = out
        return text

    def data(self, data: bytes, hits: Hits) -> bytes:
        """Raw bytes redacted as UTF-8 text; bytes that are not UTF-8 kept as they are."""
        text = data.decode("utf-8", "surrogateescape")
        out = self.text(text, hits)
        return data if out is text else out.encode("utf-8", "surrogateescape")

    def value(self, value: Any, hits: Hits) -> Any:
        """A JSON value, text or bytes, redacted (containers in place)."""
        if isinstance(value, str):
            return self.text(value, hits)
        if isinstance(value, bytes):
            return self.data(value, hits)
        if isinstance(value, dict | list):
            self.walk(value, hits)
        return value

    def walk(self, root: dict[str, Any] | list[Any], hits: Hits) -> None:
        """Redact every string in a JSON value in place, keys too, and every number as its
        text (a changed one becomes a string); no recursion, so any depth.

        The value is searched whole first (`_candidates`): most hold no match, and then no
        string of it is searched on its own."""
        rules = self._candidates(root)
        if rules is None:
            return
        renamed: list[tuple[dict[str, Any], str, str]] = []
        stack: list[Any] = [root]
        while stack:  # bounded: each container is pushed once
            node = stack.pop()
            if isinstance(node, dict):
                for key in node:
                    if isinstance(key, str) and (new := self.text(key, hits, rules)) is not key:
                        renamed.append((node, key, new))
                items: Any = node.items()
            else:
                items = enumerate(node)
            for key, item in items:
                if isinstance(item, str):
                    if (new := self.text(item, hits, rules)) is not item:
                        node[key] = new
                elif isinstance(item, dict | list):
                    stack.append(item)
                elif isinstance(item, int | float) and not isinstance(item, bool):
                    text = str(item)  # a card or a phone number is often sent as one
                    if (new := self.text(text, hits, rules)) is not text:
                        node[key] = new
        for node, key, new in renamed:  # after the values: every one of them was searched
            node[new] = node.pop(key)

    def _candidates(self, root: dict[str, Any] | list[Any]) -> tuple[_Compiled, ...] | None:
        """The rules that may match in a JSON value, found by searching its text once (the
        presets; any other rule may): the first that may and all after it; None when none
        may and no string in it is JSON.

        The text is the value serialised with its strings' escapes undone, so each string
        stands in it as it is, between quotes: a preset (none matches a quote, nor across
        one, and each check accepts a quote before a match as it accepts the start) matches
        in it wherever it matches in one of the strings; its pieces between quotes are
        searched, each once (`_distinct`). A string that is JSON itself (it starts with `{`
        or `[`) is parsed and searched on its own (`text`)."""
        try:
            serialised = orjson.dumps(root, option=orjson.OPT_NON_STR_KEYS).decode()
        except TypeError:  # ints beyond 64 bits: search string by string
            return self._rules
        nested = _NESTED_JSON.search(serialised) is not None
        if "\\" in serialised:
            serialised = _ESCAPE.sub(_unescape, serialised)
        distinct = _distinct(serialised)
        for at, rule in enumerate(self._rules):
            if not rule.screens or rule.found_in(distinct):
                # The rules after it see its replacements (new text around a match): each may.
                return self._rules[at:]
        return () if nested else None

    def found(self, text: str) -> Hits:
        """The names of the rules that match somewhere in `text` (nothing is replaced)."""
        distinct = _distinct(text)
        return {
            rule.name for rule in self._rules if rule.found_in(distinct if rule.screens else text)
        }

    def answer(self, response: Any, raw_stream: bytes | None, hits: Hits) -> tuple[Any, list[str]]:
        """An answer (JSON, text or bytes; containers in place) redacted, and what cannot be
        kept of it: `raw_stream` and `logprobs`, when any rule matched in it or in the
        stream's raw bytes (`raw_stream`, gzip or plain, is only searched)."""
        found: Hits = set()
        response = self.value(response, found)
        if raw_stream is not None and not found:
            for _ in range(2):  # the copy's gzip, then the upstream's own compression
                if raw_stream.startswith(b"\x1f\x8b"):
                    raw_stream = gzip.decompress(raw_stream)
            found = self.found(raw_stream.decode("utf-8", "surrogateescape"))
        if not found:
            return response, []
        hits |= found
        dropped = ["raw_stream"] if raw_stream is not None else []
        if drop_logprobs(response):
            dropped.append("logprobs")
        return response, dropped


def drop_logprobs(response: Any) -> bool:
    """Set every `logprobs` in a response to null, in place (chat and text choices, Responses
    API output content, stream events); whether there were any."""
    dropped = False
    stack: list[Any] = [response]
    while stack:  # bounded: each container is pushed once
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("logprobs") is not None:
                node["logprobs"] = None
                dropped = True
            stack.extend(v for v in node.values() if isinstance(v, dict | list))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, dict | list))
    return dropped


_NESTED_JSON = re.compile(r'[\[{:,]"[\[{]')
"""In serialised JSON: a string (value or key) that starts with `{` or `[` (a quote inside a
string is always escaped, so a quote after `[{:,]` opens one)."""
_ESCAPE = re.compile(r'\\(["\\/bfnrt]|u[0-9a-fA-F]{4})')
_ESCAPED = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _distinct(text: str) -> str:
    """`text`'s pieces between quotes, each once, joined by NUL: what a preset is searched in
    for a yes or no. No preset matches a quote or a NUL, and each check accepts a match at the
    start of a piece as it accepts one after a quote; a text of repeated structure (a stream's
    events, logprobs) shrinks to its distinct parts."""
    return "\x00".join(set(text.split('"')))


def _unescape(match: re.Match[str]) -> str:
    code = match.group(1)
    return _ESCAPED.get(code) or chr(int(code[1:], 16))


def _loads(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
