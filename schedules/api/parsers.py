"""Request parsers of the tenant API: JSON bodies with a bounded nesting depth."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

# Far deeper than any real payload, far shallower than Python's recursion limit: json, DRF and psycopg all
# recurse per level, so a body nested ~1000 deep would otherwise end as a RecursionError (a 500).
MAX_JSON_DEPTH = 64


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


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser, with too-deep nesting reported as a parse error (400) instead of crashing."""

    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        message = f"JSON parse error - nested deeper than {MAX_JSON_DEPTH} levels."
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(message) from None
        if json_depth_exceeds(data):
            raise ParseError(message)
        return data
