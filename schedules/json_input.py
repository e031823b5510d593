"""Strict JSON for payloads, one rule for the API and the console: what PostgreSQL's jsonb can store, bounded.

Python's json accepts NaN, Infinity, numbers beyond a float (1e999 -> inf), nesting until the interpreter's
recursion limit, U+0000 and lone surrogates. jsonb refuses the first and last kinds, and the deep ones end as a
RecursionError: each would be a 500 where a 400 (or a form error) is the answer.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from typing import Any

# Far deeper than any real payload, far shallower than Python's recursion limit: json, DRF and psycopg all
# recurse per level, so a body nested ~1000 deep would otherwise end as a RecursionError (a 500).
MAX_JSON_DEPTH = 64


class JSONInputError(ValueError):
    """Input that is not strict, storable JSON; the message says why, for the field's error."""


def json_depth_exceeds(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when lists/objects nest deeper than `limit`; iterative, so it cannot itself overflow the stack."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children: Iterable[Any]
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def _refuse_constant(name: str) -> Any:
    raise JSONInputError(f"{name} is not JSON.")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise JSONInputError(f"The number {text[:40]} is out of range.")
    return value


def loads_strict(text: str) -> Any:
    """Parse `text` as strict JSON (no NaN/Infinity, finite numbers, bounded depth); raises JSONInputError."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except RecursionError:
        raise JSONInputError(f"Nested deeper than {MAX_JSON_DEPTH} levels.") from None
    except json.JSONDecodeError as exc:
        raise JSONInputError(f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}).") from None
    if json_depth_exceeds(value):
        raise JSONInputError(f"Nested deeper than {MAX_JSON_DEPTH} levels.")
    return value


# An escaped U+0000 in json.dumps output that is not itself an escaped backslash followed by "u0000".
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def storable_json(value: Any) -> bool:
    """PostgreSQL's jsonb refuses U+0000 and lone surrogates, both of which Python's json accepts."""
    text = json.dumps(value, ensure_ascii=False)
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return _NUL_ESCAPE.search(text) is None
