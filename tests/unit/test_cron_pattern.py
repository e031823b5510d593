"""The cron pattern the API schema publishes against parse_cron, and the schema's instant pattern against the API's
parsing: what a client reads in the schema is what the API accepts."""

from __future__ import annotations

import re
from datetime import date

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.cron_syntax import MACROS, MAX_CRON_LENGTH, TimeRuleError, cron_pattern, parse_cron
from schedules.api.schema import INSTANT
from schedules.api.serializers import InstantInvalid, parse_instant
from tests.support import examples

CRON = re.compile(cron_pattern())
INSTANT_PATTERN = re.compile(INSTANT["pattern"])
# The two rules the pattern leaves to the text (cron_syntax: "the syntax as one regular expression").
UNSTATED_RULES = ("runs backwards", "never fires")


def api_accepts(text: str) -> bool:
    """As the API reads a cron field: stripped by the serializer, then parsed."""
    try:
        parse_cron(text.strip())
    except TimeRuleError:
        return False
    return True


def refusal(text: str) -> str:
    with pytest.raises(TimeRuleError) as refused:
        parse_cron(text.strip())
    return refused.value.message


def numbers(low: int, high: int) -> st.SearchStrategy[str]:
    """Numerals a little beyond the field's range too, sometimes with leading zeros."""
    return st.builds(lambda zeros, value: "0" * zeros + str(value), st.integers(0, 2), st.integers(low, high))


WORDS = st.sampled_from(["jan", "Feb", "DEC", "sun", "Mon", "sat", "l", "w", "x"])
ELEMENTS = st.one_of(
    st.just("*"),
    st.builds("*/{}".format, numbers(0, 70)),
    numbers(0, 70),
    WORDS,
    st.builds("{}-{}".format, st.one_of(numbers(0, 70), WORDS), st.one_of(numbers(0, 70), WORDS)),
    st.builds("{}-{}/{}".format, numbers(0, 70), numbers(0, 70), numbers(0, 70)),
    st.builds("{}/{}".format, numbers(0, 70), numbers(0, 70)),
    st.sampled_from(["", "?", "#", "L", "5#2"]),
)
FIELDS = st.lists(ELEMENTS, min_size=1, max_size=3).map(",".join)
EXPRESSIONS = st.one_of(
    st.builds(
        lambda fields, gaps, before, after: before + "".join(f + g for f, g in zip(fields, gaps, strict=False)) + after,
        st.lists(FIELDS, min_size=4, max_size=6),
        st.lists(st.sampled_from([" ", "\t", "  ", " \t"]), min_size=6, max_size=6),
        st.sampled_from(["", " ", "\n", "\u3000"]),
        st.sampled_from(["", " ", "\r\n", "\x1c"]),
    ),
    st.sampled_from([*MACROS, "@DAILY", "@reboot", "@every", "@daily *"]),
)


@settings(max_examples=examples(500))
@given(EXPRESSIONS)
def test_the_pattern_matches_every_expression_the_api_accepts(text):
    if api_accepts(text):
        assert CRON.fullmatch(text), text


@settings(max_examples=examples(500))
@given(EXPRESSIONS)
def test_a_matching_expression_the_api_refuses_breaks_a_rule_the_pattern_leaves_to_its_description(text):
    if CRON.fullmatch(text) and not api_accepts(text):
        assert any(rule in refusal(text) for rule in UNSTATED_RULES), (text, refusal(text))


@settings(max_examples=examples(200), deadline=None)
@given(st.from_regex(CRON, fullmatch=True).filter(lambda text: len(text) <= MAX_CRON_LENGTH))  # the schema's maxLength
def test_what_the_pattern_generates_parses_or_breaks_an_unstated_rule(text):
    if not api_accepts(text):
        assert any(rule in refusal(text) for rule in UNSTATED_RULES), (text, refusal(text))


@pytest.mark.parametrize(
    ("text", "matches"),
    [
        ("30 2 * * *", True),
        (" @Daily\n", True),
        ("0 9 * jan-MAR mon-fri", True),
        ("*/60 0-23/24 1,15,31 */12 0-7", True),
        ("*/61 * * * *", False),
        ("5/2 * * * *", False),
        ("60 * * * *", False),
        ("0 0 * * * 2026", False),
        ("@reboot", False),
        ("0\u30000 * * *", False),
    ],
)
def test_the_pattern_on_chosen_expressions(text, matches):
    assert bool(CRON.fullmatch(text)) is matches
    assert api_accepts(text) is matches


# --- instants --------------------------------------------------------------------------------------------


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
