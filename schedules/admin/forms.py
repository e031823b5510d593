"""The console's schedule forms: the definition (validated by the same rules as the API), notes, backfill ranges."""

from __future__ import annotations

import zoneinfo
from collections.abc import Iterable
from typing import Any, cast

from django import forms
from django.contrib.admin.helpers import ActionForm
from django.forms.fields import InvalidJSONInput

from core.choices import DstGap, DstRepeat, ScheduleState
from dispatch.services import registered_names
from scheduler_project.console import InstantField
from schedules.admin.labels import LabelsField
from schedules.calendars import check_exclude_calendars
from schedules.definitions import TIME_FIELDS, clean_definition
from schedules.errors import ScheduleInvalid
from schedules.json_input import JSONInputError, loads_strict, storable_json
from schedules.models import DEFINITION_FIELDS, Schedule


class PayloadField(forms.JSONField):
    """The payload as text, parsed by the API's strict rules (schedules/json_input.py): NaN, 1e999, a lone
    surrogate or 3,000-deep nesting is a form error here exactly as it is a 400 there, never a 500."""

    def _strict(self, text: str) -> Any:
        value = loads_strict(text)
        if not isinstance(value, dict):
            raise JSONInputError("Must be a JSON object.")
        if not storable_json(value):
            raise JSONInputError("Contains U+0000 or an unpaired surrogate (U+D800-U+DFFF), which cannot be stored.")
        return value

    def to_python(self, value: Any) -> Any:
        if self.disabled or value in self.empty_values or isinstance(value, dict):
            return super().to_python(value)
        try:
            return self._strict(value)
        except JSONInputError as exc:
            raise forms.ValidationError(str(exc), code="invalid") from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        if self.disabled or data is None:
            return super().bound_data(data, initial)
        try:
            return self._strict(data)
        except JSONInputError:
            # Shown back as the operator typed it (plain text), not re-parsed by the lenient json module.
            return InvalidJSONInput(data)


class ScheduleDefinitionForm(forms.ModelForm):
    """The definition, validated by the same rules as the API (definitions.clean_definition).

    It never saves the model itself: a change goes to update_schedule (ScheduleChangeForm, through
    ScheduleAdmin.save_model), a new schedule to create_schedule (ScheduleAddForm).
    """

    payload = PayloadField(required=False, help_text="A JSON object handed to the handler as its payload.")
    handler = forms.ChoiceField()
    timezone = forms.ChoiceField(help_text="IANA zone: cron fields are wall-clock time in this zone.")
    labels = LabelsField()

    class Meta:
        model = Schedule
        fields = DEFINITION_FIELDS
        labels = {
            "run_at": "Run at (UTC)",
            "every_seconds": "Every (seconds)",
            "anchor_at": "Anchor at (UTC)",
            "max_runs": "Max runs",
            "start_at": "Start at (UTC)",
            "end_at": "End at (UTC)",
            "exclude_calendars": "Exclude calendars",
            "dst_gap": "Skipped local times",
            "dst_repeat": "Repeated local times",
        }
        help_texts = {
            "cron": "5 fields: minute hour day-of-month month day-of-week (kind 'cron' only).",
            "run_at": "The single fire of a schedule of kind 'once'.",
            "every_seconds": "Seconds between fires, 1 to 31536000 (kind 'interval' only): elapsed time, which clock "
            "changes never move.",
            "anchor_at": "The rhythm's origin: fires at anchor + k x every seconds (kind 'interval' only). Empty: "
            "now, to the second.",
            "dst_gap": "A local time the clocks skip (spring forward): skip fires nothing that day; shift fires at "
            "the instant it names on the offset from before the change (02:30 in New York fires at 03:30 EDT).",
            "dst_repeat": "A local time the clocks repeat (fall back): fire at its first instant, its last, or both "
            "(two runs).",
            "max_runs": "Only this many fires happen (missed ones count, Run now does not); then the schedule is "
            "completed. A change moves the runs left by as much. Empty: no limit.",
            "start_at": "No fire before this instant. Empty: from now.",
            "end_at": "No fire after this instant; once it has passed and nothing is pending, the schedule is "
            "completed. Empty: no end.",
            "exclude_calendars": "Names of this tenant's calendars, comma-separated: no fire on their dates (in "
            "this schedule's zone) or in their ranges. Empty: none.",
        }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stored = {field: getattr(self.instance, field) for field in DEFINITION_FIELDS}
        self.definition: dict[str, Any] = {}
        cast(forms.ChoiceField, self.fields["handler"]).choices = _choices(registered_names(), self.instance.handler)
        cast(forms.ChoiceField, self.fields["timezone"]).choices = _choices(_zone_names(), self.instance.timezone)
        for name, policies in (("dst_gap", DstGap), ("dst_repeat", DstRepeat)):
            if name in self.fields:
                # The empty choice is what a schedule without a policy has: name the behaviour, not "---------".
                default = f"Default ({policies.values[0]})"
                cast(forms.ChoiceField, self.fields[name]).choices = [("", default), *policies.choices]

    def check_definition(self, cleaned: dict[str, Any], tenant_id: int | None) -> None:
        """clean_definition over the typed fields, then the tenant's calendars; each refusal on its field."""
        # The fields of the other kinds are dropped rather than reported: without JavaScript the form shows them all.
        kind = cleaned.get("kind")
        if kind in TIME_FIELDS:
            for owner, fields in TIME_FIELDS.items():
                for field in fields if owner != kind else ():
                    cleaned[field] = None
        try:
            self.definition = clean_definition({field: cleaned.get(field) for field in DEFINITION_FIELDS})
            if tenant_id is not None:
                check_exclude_calendars(tenant_id, self.definition["exclude_calendars"], lock=False)
        except ScheduleInvalid as exc:
            self.add_refusal(exc)

    def add_refusal(self, exc: ScheduleInvalid) -> None:
        for field, field_errors in exc.errors.items():
            self.add_error(field if field in self.fields else None, field_errors)

    def _post_clean(self) -> None:
        """Neither copy the input onto the instance nor run the model's own validation.

        The rules are clean_definition's (above), so the model's field validators and check constraints would only
        repeat them in other words ("Constraint schedule_kind_has_time is violated."): a second round of errors.
        And the instance stays the stored row, so the page's summary, next fire and cursor describe what is stored
        after a rejected edit, not the rejected input. The services write the schedule, never this form.
        """


class ScheduleChangeForm(ScheduleDefinitionForm):
    """A stored schedule's definition; `seen_version` rejects a save over a version the operator never saw.

    ScheduleAdmin.save_model hands `definition_changes()` to update_schedule, which writes a new version.
    """

    seen_version = forms.IntegerField(widget=forms.HiddenInput)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["seen_version"].initial = self.instance.version

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        seen = cleaned.get("seen_version")
        current = Schedule.objects.filter(pk=self.instance.pk).values_list("version", flat=True).first()
        if seen is not None and current is not None and seen != current:
            raise forms.ValidationError(
                f"This schedule changed while you were editing it (you saw version {seen}, it is now "
                f"version {current}). Reload the page and apply your change again."
            )
        if self.instance.state == ScheduleState.CANCELED:
            raise forms.ValidationError("A canceled schedule cannot be changed.")
        if not self.errors:
            self.check_definition(cleaned, self.instance.tenant_id)
        return cleaned

    def definition_changes(self) -> dict[str, Any]:
        return {field: value for field, value in self.definition.items() if value != self.stored[field]}


# Long enough for a sentence and a ticket link; the version row keeps it for as long as the schedule exists.
NOTE_MAX_LENGTH = 500


def note_field(max_length: int | None = NOTE_MAX_LENGTH) -> forms.CharField:
    return forms.CharField(
        required=False,
        max_length=max_length,
        strip=True,
        help_text="Why (kept on the new version, shown in its history), e.g. 'upstream API down, INC-1234'.",
        widget=forms.TextInput(attrs={"size": 60, "placeholder": "note (why), kept on the version"}),
    )


class NoteActionForm(ActionForm):
    """The list's action bar with a note: pause, resume and cancel keep it on each new version.

    No length limit on the field itself: an invalid action form reads as "No action selected", so the action
    checks the length and says what is wrong (ScheduleAdmin._note)."""

    note = note_field(max_length=None)


class OperationForm(forms.Form):
    """The confirmation of one operation on one schedule (pause, resume, cancel, run now)."""

    note = note_field()


class PauseForm(OperationForm):
    """A pause's confirmation: the note, and when the schedule resumes by itself (optional)."""

    resume_at = InstantField(
        required=False,
        label="Resume at (UTC)",
        help_text="Optional: the schedule resumes by itself then, as a new version. Empty: paused until resumed.",
    )


class BackfillForm(forms.Form):
    """A past range of one schedule to create the missing fires of (dispatch.backfill.backfill_schedule)."""

    since = InstantField(label="Since (UTC)", help_text="Inclusive.")
    until = InstantField(label="Until (UTC)", help_text="Exclusive; not later than now.")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        since, until = cleaned.get("since"), cleaned.get("until")
        if since is not None and until is not None and since >= until:
            self.add_error("until", "Must be later than since.")
        return cleaned


def _choices(names: Iterable[str], current: str | None) -> list[tuple[str, str]]:
    values = sorted(set(names) | ({current} if current else set()))
    return [(value, value) for value in values]


def _zone_names() -> set[str]:
    return zoneinfo.available_timezones() - {"localtime", "posixrules", "Factory"}
