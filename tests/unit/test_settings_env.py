"""The typed environment readers of scheduler_project/env.py: defaults, parsing, and loud failures."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from scheduler_project.env import env_bool, env_float, env_int, env_list, env_rate, env_str

NAME = "SCHEDULER_TEST_SETTING"


@pytest.fixture
def env(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)

    def set_to(value: str) -> None:
        monkeypatch.setenv(NAME, value)

    return set_to


# --- env_str --------------------------------------------------------------------------------------------


def test_env_str_returns_the_default_when_unset(env):
    assert env_str(NAME, "fallback") == "fallback"


def test_env_str_returns_the_value_verbatim_when_set(env):
    env("  spaced value ")

    assert env_str(NAME, "fallback") == "  spaced value "


def test_env_str_keeps_an_empty_value_rather_than_the_default(env):
    env("")

    assert env_str(NAME, "fallback") == ""


# --- env_bool -------------------------------------------------------------------------------------------


def test_env_bool_returns_the_default_when_unset(env):
    assert env_bool(NAME, True) is True
    assert env_bool(NAME, False) is False


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "Yes", "on", " on "])
def test_env_bool_reads_true_spellings(env, raw):
    env(raw)

    assert env_bool(NAME, False) is True


@pytest.mark.parametrize("raw", ["0", "false", "False", "no", "OFF", ""])
def test_env_bool_reads_false_spellings(env, raw):
    env(raw)

    assert env_bool(NAME, True) is False


@pytest.mark.parametrize("raw", ["maybe", "2", "y", "enabled"])
def test_env_bool_fails_loudly_on_anything_else_naming_the_variable(env, raw):
    env(raw)

    with pytest.raises(ImproperlyConfigured, match=NAME):
        env_bool(NAME, False)


# --- env_int --------------------------------------------------------------------------------------------


def test_env_int_returns_the_default_when_unset(env):
    assert env_int(NAME, 42) == 42


def test_env_int_parses_a_value_with_surrounding_whitespace(env):
    env(" 17 ")

    assert env_int(NAME, 42) == 17


def test_env_int_parses_negative_numbers(env):
    env("-3")

    assert env_int(NAME, 0) == -3


@pytest.mark.parametrize("raw", ["ten", "1.5", "", "0x10", "1e3"])
def test_env_int_fails_loudly_on_a_non_integer(env, raw):
    env(raw)

    with pytest.raises(ImproperlyConfigured, match=f"{NAME}=.*not an integer"):
        env_int(NAME, 1)


def test_env_int_enforces_its_minimum(env):
    env("0")

    with pytest.raises(ImproperlyConfigured, match="below its minimum 1"):
        env_int(NAME, 5, minimum=1)


def test_env_int_enforces_its_maximum(env):
    env("1001")

    with pytest.raises(ImproperlyConfigured, match="above its maximum 1000"):
        env_int(NAME, 5, maximum=1000)


def test_env_int_accepts_both_bounds_themselves(env):
    env("1")
    assert env_int(NAME, 5, minimum=1, maximum=10) == 1
    env("10")
    assert env_int(NAME, 5, minimum=1, maximum=10) == 10


def test_env_int_does_not_check_the_default_against_the_bounds(env):
    # Defaults are written by us, next to their bounds; only the operator's input needs checking.
    assert env_int(NAME, 0, minimum=1) == 0


# --- env_float ------------------------------------------------------------------------------------------


def test_env_float_returns_the_default_when_unset(env):
    assert env_float(NAME, 120.0) == 120.0


@pytest.mark.parametrize(("raw", "expected"), [("1.5", 1.5), (" 2 ", 2.0), ("1e2", 100.0)])
def test_env_float_parses_numbers(env, raw, expected):
    env(raw)

    assert env_float(NAME, 0.0) == expected


def test_env_float_fails_loudly_on_a_non_number(env):
    env("fast")

    with pytest.raises(ImproperlyConfigured, match=f"{NAME}=.*not a number"):
        env_float(NAME, 1.0)


def test_env_float_enforces_its_minimum(env):
    env("0.5")

    with pytest.raises(ImproperlyConfigured, match="below its minimum"):
        env_float(NAME, 2.0, minimum=1.0)


# --- env_list -------------------------------------------------------------------------------------------


def test_env_list_returns_a_copy_of_the_default_when_unset(env):
    default = ["localhost"]

    value = env_list(NAME, default)
    value.append("mutated")

    assert value == ["localhost", "mutated"]
    assert default == ["localhost"]


def test_env_list_splits_on_commas_and_strips_blanks(env):
    env(" a.example , b.example,,  ,c.example ")

    assert env_list(NAME, ["default"]) == ["a.example", "b.example", "c.example"]


def test_env_list_of_an_empty_value_is_empty_not_the_default(env):
    env("")

    assert env_list(NAME, ["default"]) == []


@pytest.mark.parametrize("raw", ["nan", "inf"])
def test_env_float_refuses_nan_and_infinity(env, raw):
    env(raw)

    with pytest.raises(ImproperlyConfigured):
        env_float(NAME, 1.0, minimum=0.0)


# --- env_rate -------------------------------------------------------------------------------------------


def test_env_rate_returns_the_default_when_unset(env):
    assert env_rate(NAME, "6000/min") == "6000/min"


@pytest.mark.parametrize(("raw", "rate"), [("10/s", "10/s"), (" 300 / minute ", "300/minute"), ("007/hour", "7/hour")])
def test_env_rate_accepts_a_count_per_period(env, raw, rate):
    env(raw)

    assert env_rate(NAME, "1/min") == rate


@pytest.mark.parametrize("raw", ["", "fast", "0/min", "-5/min", "10/fortnight", "10", "1.5/min", "10/min/s"])
def test_env_rate_refuses_anything_else_naming_the_setting(env, raw):
    env(raw)

    with pytest.raises(ImproperlyConfigured, match=NAME):
        env_rate(NAME, "1/min")
