"""Schedule labels and label selectors (docs/API.md, "Fleet operations"): the rules of a label set, and one parsed
form of a selector that the list filter, bulk operations, export/apply and notification targets all read.

A selector is `key=value` and `key!=value` requirements joined by commas, all of which must hold. As in Kubernetes,
`env!=dev` also matches a schedule without an `env` label. The parsed form has three readings: `matches` (Python),
`as_match` (the JSON a SQL trigger reads: `labels @> equal AND NOT labels @> each of not_equal`) and the ORM filter
built from the same pairs (schedules.labels).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MAX_LABELS = 20
MAX_VALUE_LENGTH = 63
# Lower-case letters and digits, with '.', '_', '/' and '-' inside; 1-63 characters.
KEY_REGEX = r"[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?"
KEY_PATTERN = re.compile(KEY_REGEX)
KEY_RULE = "1-63 lower-case letters, digits, '.', '_', '/' or '-', starting and ending with a letter or digit"
# Values: any text but control characters (and unpaired surrogates, which PostgreSQL cannot store).
CONTROL_CLASS = "\\u0000-\\u001f\\u007f-\\u009f"
CONTROL = re.compile(f"[{CONTROL_CLASS}\\ud800-\\udfff]")
VALUE_RULE = f"a value is text of at most {MAX_VALUE_LENGTH} characters, without control characters"
MAX_SELECTOR_LENGTH = 2000
SELECTOR_RULE = (
    "'key=value' or 'key!=value' requirements joined by commas, e.g. team=payments,env!=dev (a value holding a comma "
    "cannot be selected)"
)


class SelectorInvalid(ValueError):
    """Why a selector text is not one; the message is the API's 400."""


def label_problems(labels: Any) -> list[str]:
    """What is wrong with a label set (an empty list when nothing is)."""
    if not isinstance(labels, dict):
        return ["Must be a JSON object of string keys to string values."]
    problems: list[str] = []
    if len(labels) > MAX_LABELS:
        problems.append(f"At most {MAX_LABELS} labels; {len(labels)} given.")
    for key, value in labels.items():
        if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
            problems.append(f"Label key {_shown(key)}: {KEY_RULE}.")
        if not isinstance(value, str):
            problems.append(f"Label {_shown(key)}: the value must be a string.")
        elif len(value) > MAX_VALUE_LENGTH or CONTROL.search(value):
            problems.append(f"Label {_shown(key)}: {VALUE_RULE}.")
    return problems


def _shown(key: Any) -> str:
    text = repr(key)
    return (text[:40] + "...'") if len(text) > 44 else text


@dataclass(frozen=True)
class Selector:
    """Requirements on a schedule's labels: every `equal` pair present, no `not_equal` pair present."""

    equal: tuple[tuple[str, str], ...] = ()
    not_equal: tuple[tuple[str, str], ...] = ()

    @property
    def empty(self) -> bool:
        return not self.equal and not self.not_equal

    def matches(self, labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.equal) and not any(labels.get(k) == v for k, v in self.not_equal)

    def as_match(self) -> dict[str, Any]:
        """The stored form a SQL reader applies with jsonb containment (dispatch's notification trigger)."""
        return {"equal": dict(self.equal), "not_equal": [{k: v} for k, v in self.not_equal]}

    def __str__(self) -> str:
        return ",".join([*(f"{k}={v}" for k, v in self.equal), *(f"{k}!={v}" for k, v in self.not_equal)])


def parse_selector(text: Any) -> Selector:
    """A selector text as a Selector; empty text (or None) selects everything. Raises SelectorInvalid."""
    if text is None:
        return Selector()
    if not isinstance(text, str):
        raise SelectorInvalid(f"Must be text: {SELECTOR_RULE}.")
    if len(text) > MAX_SELECTOR_LENGTH:
        raise SelectorInvalid(f"At most {MAX_SELECTOR_LENGTH} characters.")
    text = text.strip()
    if not text:
        return Selector()
    if CONTROL.search(text):
        raise SelectorInvalid(f"Control characters are not allowed: {SELECTOR_RULE}.")
    equal: dict[str, str] = {}
    not_equal: list[tuple[str, str]] = []
    for part in text.split(","):
        requirement = part.strip()
        # The first '=' ends the key (a key holds no '=' or '!'); a '!' just before it negates. The value is the
        # rest, '=' and '!' included: a label value may hold them.
        key, sep, value = requirement.partition("=")
        negated = key.endswith("!")
        key, value = key.removesuffix("!").strip(), value.strip()
        if not sep or not KEY_PATTERN.fullmatch(key):
            raise SelectorInvalid(
                f"{requirement[:80]!r} is not a requirement: {SELECTOR_RULE}; a key is {KEY_RULE}; {VALUE_RULE}."
            )
        if negated:
            not_equal.append((key, value))
        elif equal.setdefault(key, value) != value:
            raise SelectorInvalid(f"{key!r} is required to equal two values ({equal[key]!r} and {value!r}).")
    return Selector(equal=tuple(sorted(equal.items())), not_equal=tuple(sorted(set(not_equal))))
