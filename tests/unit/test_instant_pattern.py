"""The schema's instant pattern against the API's parsing: what a client reads in the schema is what the API
accepts. (A cron expression's grammar is stated in words and checked in code: core/cron_syntax.py.)"""

from __future__ import annotations

import re
from datetime import date

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedules.api.schema import INSTANT
from schedules.api.serializers import InstantInvalid, parse_instant
from tests.support import examples

INSTANT_PATTERN = re.compile(INSTANT["pattern"])


def api_reads_instant(text: str) -> bool:
    try:
        parse_instant(text)
    except InstantInvalid:
        return False
    return True


def a_calendar_date(text: str) -> bool:
    """What `format: date-time` adds to the pattern: the day exists in its month."""
    try:
        date.fromisoformat(text[:10])
    except ValueError:
        return False
    return True


@settings(max_examples=examples(300), deadline=None)
@given(st.from_regex(INSTANT_PATTERN, fullmatch=True).filter(a_calendar_date))
def test_every_instant_the_pattern_and_format_allow_is_accepted(text):
    assert api_reads_instant(text), text


@pytest.mark.parametrize(
    "text",
    [
        "1900-01-01T00:00:00Z",
        "1900-01-01T00:00:00-05:00",
        "1900-01-02T00:00:00+14:00",
        "8999-12-31T23:59:59.999999Z",
        "8999-12-31T00:00:00+05:00",
        "2026-12-01T09:00:00.5+01:00",
    ],
)
def test_instants_at_the_edges_of_the_range_match_and_are_accepted(text):
    assert INSTANT_PATTERN.fullmatch(text)
    assert api_reads_instant(text)


@pytest.mark.parametrize(
    "text",
    [
        "1899-12-31T23:59:59Z",
        "1900-01-01T00:30:00+01:00",  # 1899 in UTC
        "8999-12-31T23:00:00-02:00",  # 9000 in UTC
        "9000-01-01T00:00:00Z",
        "2026-12-01T09:00:00",  # no offset
        "2026-12-01t09:00:00z",
        "2026-12-01T09:00:60Z",
    ],
)
def test_instants_the_api_refuses_do_not_match(text):
    assert not INSTANT_PATTERN.fullmatch(text)
    assert not api_reads_instant(text)
