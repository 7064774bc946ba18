"""The `[[redact]]` presets (`redact.py`): their patterns and what judges a match of each.

A preset's pattern finds candidates; its check (`CHECKS`) judges what comes before a match
and what the pattern alone cannot tell (a card's Luhn digit). `card` finds runs of digit
groups, and `card_spans` looks for a card at every group of a run: a card after another
number ("item 3 4111 1111 1111 1111") or followed by one is found, in time linear in the run.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Iterator

_BEARER = r"(?i:earer)\s+[A-Za-z0-9._~+/-]{16,}=*"
PRESETS: dict[str, str] = {
    "email": r"[A-Za-z0-9._%+-]{1,64}@(?:[A-Za-z0-9-]{1,63}\.){1,8}[A-Za-z]{2,24}",
    "card": r"[0-9](?:[ -]?[0-9]){12,}",  # digit groups, 13+ digits: `card_spans` judges
    "phone": (  # the first character taken by one class, then told apart by lookbehinds
        r"[+(0-9](?:(?<=\+)[0-9]{1,3}[ .-]?(?:\([0-9]{1,4}\)|[0-9]{1,4})(?:[ .-]?[0-9]{2,4}){1,4}"
        r"|(?<=\()[0-9]{3}\)[ .-]?[0-9]{3}[ .-]?[0-9]{4}"
        r"|(?<=[0-9])[0-9]{2}[.-][0-9]{3}[.-][0-9]{4})(?!\w)"
    ),
    "api_key": (
        r"(?:sk-[A-Za-z0-9_-]{20,}"  # OpenAI (sk-, sk-proj-), Anthropic
        # any bearer token, any case; two branches, so that every branch starts with one
        # letter (Python's search then skips positions where none does)
        rf"|B{_BEARER}|b{_BEARER}"
        r"|AKIA[0-9A-Z]{16}"  # AWS access key id
        r"|AIza[0-9A-Za-z_-]{35}"  # Google API key
        r"|gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,}"  # GitHub
        r"|glpat-[A-Za-z0-9_-]{20,}"  # GitLab
        r"|xox[abprs]-[A-Za-z0-9-]{10,}"  # Slack
        r"|hf_[A-Za-z0-9]{30,}"  # Hugging Face
        # a JWT, never from inside a run of its characters (each "eyJ" of one would rescan it)
        r"|eyJ(?<![A-Za-z0-9_-]eyJ)[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"
        # PEM: the body holds no "--", so it never reaches into the next header
        r"|-----BEGIN[A-Z ]{0,20} PRIVATE KEY-----(?:[A-Za-z0-9+/=\s:,]|-(?!-)){0,8000}"
        r"-----END[A-Z ]{0,20} PRIVATE KEY-----)"
    ),
}
"""Patterns of the presets. None starts with a lookbehind or an alternation (what comes before
a match is the check's to judge): Python's engine skips ahead to where a pattern's first
character class can match (docs/performance.md). Digits are ASCII (`[0-9]`, not a digit
category, which Python tests character by character). Each is searched in linear time: an
unbounded repetition ends the match (it cannot fail after it), and what could fail after a
long run cannot start again inside it."""


def luhn(digits: str) -> bool:
    """Whether a run of digits (spaces and dashes ignored) passes the Luhn check."""
    total = 0
    for position, char in enumerate(reversed(digits.replace(" ", "").replace("-", ""))):
        value = int(char) * (2 if position % 2 else 1)
        total += value - 9 if value > 9 else value
    return total % 10 == 0


def _before(match: re.Match[str]) -> str:
    """The character before a match ("" at the start)."""
    start = match.start()
    return match.string[start - 1] if start else ""


def _phone(match: re.Match[str]) -> bool:
    """Not the tail of a word or a number, and 7 to 15 digits (E.164's most)."""
    before = _before(match)
    if before and (before.isalnum() or before in "_+"):
        return False
    return 7 <= sum(char.isdigit() for char in match.group()) <= 15


def _key(match: re.Match[str]) -> bool:
    """Not the tail of a word (`task-...` is not an `sk-` key)."""
    before = _before(match)
    return not (before.isascii() and before.isalnum())


CHECKS: dict[str, Callable[[re.Match[str]], bool]] = {"phone": _phone, "api_key": _key}
HINTS = {"email": "@"}
"""A substring every match of the preset holds: text without it is not searched."""
DIGITS = {"card": 13, "phone": 7}
"""The fewest ASCII digits a match of the preset holds: text with fewer is not searched
(counting digits is done in C by `bytes.translate`; see docs/performance.md)."""
_NOT_DIGITS = bytes(b for b in range(256) if not 0x30 <= b <= 0x39)


def digit_count(text: str) -> int:
    """ASCII digits in `text`."""
    return len(text.encode("utf-8", "surrogateescape").translate(None, _NOT_DIGITS))


_CARD_RUN = re.compile(PRESETS["card"])
_GROUP = re.compile(r"[0-9]+")
_DOUBLED = (0, 2, 4, 6, 8, 1, 3, 5, 7, 9)


def card_spans(text: str) -> Iterator[tuple[int, int]]:
    """Where `text` holds a card: 13 to 19 digits of one run of groups, the first not 0,
    starting and ending at a group's edge, not glued to a word, a longer number or a decimal
    fraction (`chatcmpl-AB0000000000000000` is an id), Luhn-valid. At each group the longest
    card is taken; the search goes on after it."""
    for run in _CARD_RUN.finditer(text):
        yield from _cards_in(text, run.start(), run.end())


def _cards_in(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    groups = [group.span() for group in _GROUP.finditer(text, start, end)]
    counts = [0]  # digits in groups[:k]
    for first, last in groups:
        counts.append(counts[-1] + last - first)
    if counts[-1] < 13:
        return
    sums: tuple[list[int], list[int]] | None = None  # made when a slice may be a card
    before, after = text[start - 1 : start], text[end : end + 1]
    at = 1 if before and (before.isalnum() or before in "._") else 0
    ends = len(groups) - (1 if after.isascii() and (after.isalnum() or after == "_") else 0)
    while at < len(groups):  # bounded: `at` grows each time; at most 7 tries each
        found = 0
        if text[groups[at][0]] != "0":
            stop = min(ends, bisect_right(counts, counts[at] + 19) - 1)
            while stop > at and counts[stop] - counts[at] >= 13:
                sums = sums or _luhn_sums(text[start:end].replace(" ", "").replace("-", ""))
                prefix = sums[(counts[stop] - 1) % 2]
                if (prefix[counts[stop]] - prefix[counts[at]]) % 10 == 0:
                    found = stop
                    break
                stop -= 1
        if found:
            yield groups[at][0], groups[found - 1][1]
        at = found or at + 1


def _luhn_sums(digits: str) -> tuple[list[int], list[int]]:
    """Prefix sums that give the Luhn sum of any slice `digits[i:j]` in one subtraction:
    `even` doubles the digits at odd indices (a slice whose last index is even), `odd` those
    at even indices."""
    even, odd = [0], [0]
    for index, char in enumerate(digits):
        value = ord(char) - 48
        doubled = _DOUBLED[value]
        even.append(even[-1] + (doubled if index % 2 else value))
        odd.append(odd[-1] + (value if index % 2 else doubled))
    return even, odd
