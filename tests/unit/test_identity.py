"""Occurrence ids are a contract: the same fire gets the same id in every release, on every host."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from dispatch.identity import OCCURRENCE_NAMESPACE, occurrence_id_for, utc_key

SCHEDULE = uuid.UUID("0b7c7f1e-3c1a-4f7e-9a55-2d6f8a3b9c10")


def test_an_occurrence_id_is_pinned_for_ever():
    # Written down once: a change of the formula would give every future fire a new id and defeat deduplication.
    fire = datetime(2026, 12, 1, 7, 30, tzinfo=UTC)
    assert occurrence_id_for(SCHEDULE, 3, fire) == uuid.UUID("097298f6-c452-5339-b229-60eabf800248")


def test_the_same_instant_in_another_zone_is_the_same_fire():
    fire = datetime(2026, 12, 1, 7, 30, tzinfo=UTC)
    in_new_york = fire.astimezone(timezone(timedelta(hours=-5)))
    assert occurrence_id_for(SCHEDULE, 3, in_new_york) == occurrence_id_for(SCHEDULE, 3, fire)


@given(
    schedule_id=st.uuids(),
    version=st.integers(min_value=1, max_value=10**6),
    fire=st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(9000, 1, 1), timezones=st.just(UTC)),
)
def test_the_id_is_uuid5_of_schedule_version_and_utc_instant(schedule_id, version, fire):
    expected = uuid.uuid5(OCCURRENCE_NAMESPACE, f"{schedule_id}/{version}/{utc_key(fire)}")
    made = occurrence_id_for(schedule_id, version, fire)
    assert made == expected
    assert expected.version == 5
    # Built without uuid.UUID.__init__: every face of it must still be uuid5's.
    assert (made.version, made.variant, made.is_safe) == (5, uuid.RFC_4122, expected.is_safe)
    assert (str(made), made.bytes, hash(made)) == (str(expected), expected.bytes, hash(expected))
