"""Query-string filters of the schedule list (`?state=`, `?handler=`, `?name=`)."""

from __future__ import annotations

import django_filters

from schedules.models import Schedule, ScheduleState


class ScheduleFilter(django_filters.FilterSet):
    state = django_filters.ChoiceFilter(choices=ScheduleState.choices)
    handler = django_filters.CharFilter(max_length=100)
    name = django_filters.CharFilter(max_length=200)

    class Meta:
        model = Schedule
        fields = ["state", "handler", "name"]
