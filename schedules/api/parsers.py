"""Request parsers of the tenant API: JSON bodies with a bounded nesting depth."""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from schedules.json_input import MAX_JSON_DEPTH, json_depth_exceeds


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
