"""Wire shapes of schedules, previews and occurrences; types are checked here, rules in the services."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db.models import TextChoices
from django.http import QueryDict
from django.utils.dateparse import parse_datetime
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.choices import DstGap, DstRepeat, Kind, Lane, MisfirePolicy, OverlapPolicy, ScheduleState
from core.clock import db_now
from core.timerules import EARLIEST_INSTANT, EVERY_SECONDS_RANGE, LATEST_INSTANT, TimeRule, local_time
from dispatch.models import Attempt, Occurrence, OccurrenceState
from dispatch.services import earliest_pending_fire
from schedules.calendar_names import MAX_CALENDARS_PER_SCHEDULE, NAME_REGEX
from schedules.definitions import MAX_RUNS, NUMERIC_RANGES, RETRY_RANGES
from schedules.json_input import MAX_JSON_DEPTH, json_depth_exceeds
from schedules.models import DEFINITION_FIELDS, Schedule
from schedules.services import MAX_PREVIEW_COUNT

# The column that stores a create's Idempotency-Key; a longer key would fail in the database rather than as a 400.
MAX_IDEMPOTENCY_KEY_LENGTH: int = Schedule._meta.get_field("idempotency_key").max_length or 0
# Keys the server sets. A PATCH may send them back from a GET unchanged (ignored); a different value is a 400, not a
# silent no-op: `{"state": "paused"}` answered 200 and bumped the version without pausing anything.
READ_ONLY_KEYS = frozenset(
    {"id", "state", "resume_at", "version", "next_run_at", "remaining_runs", "created_at", "updated_at"}
)
# Marks a schedule whose pending fire the queryset did not annotate (a detail view): looked up on demand.
_NOT_LOADED = object()
READ_ONLY_HINTS = {
    "state": "Read-only: change it with POST .../pause/, .../resume/ or .../cancel/.",
    "resume_at": 'Read-only: set it with POST .../pause/ {"resume_at": ...}.',
}
# Instants accepted on input: the time rules' range (core.timerules), kept here under these names for the schema.


# Any: DRF's stubs type the messages as text or lazy text, and dict is invariant.
INSTANT_ERRORS: dict[str, Any] = {
    "invalid": "Not an ISO 8601 date-time, e.g. 2026-12-01T09:00:00Z.",
    "naive": "Give an offset or 'Z' (ISO 8601), e.g. 2026-12-01T09:00:00Z.",
    "range": f"Must be from {EARLIEST_INSTANT.year} up to {LATEST_INSTANT.year} (UTC).",
}


class InstantInvalid(ValueError):
    """Why a text is not an accepted instant; `code` is a key of INSTANT_ERRORS."""

    def __init__(self, code: str) -> None:
        super().__init__(INSTANT_ERRORS[code])
        self.code = code


def parse_instant(data: Any) -> datetime:
    """An ISO 8601 text with an explicit offset or Z, as a UTC datetime within the accepted range.

    One rule for bodies (AwareDateTimeField) and query strings (the list filters); raises InstantInvalid.
    """
    if not isinstance(data, str):
        raise InstantInvalid("invalid")
    try:
        value = parse_datetime(data.strip())
    except ValueError:
        value = None
    if value is None:
        raise InstantInvalid("invalid")
    if value.tzinfo is None:
        raise InstantInvalid("naive")
    try:
        value = value.astimezone(UTC)
    except OverflowError:
        raise InstantInvalid("range") from None
    if not EARLIEST_INSTANT <= value < LATEST_INSTANT:
        raise InstantInvalid("range")
    return value


class FlatListField(serializers.ListField):
    """A list whose items' errors come as one flat list of messages ("item 2: ..."): the API's 400 is
    {field: [message, ...]}, and DRF would nest them by index."""

    def to_internal_value(self, data: Any) -> list:
        try:
            return super().to_internal_value(data)
        except serializers.ValidationError as exc:
            raise serializers.ValidationError(_flat_messages(exc.detail)) from None


def _flat_messages(detail: Any, prefix: str = "") -> list[str]:
    if isinstance(detail, dict):
        return [m for key, value in detail.items() for m in _flat_messages(value, f"{prefix}{_label(key)}: ")]
    if isinstance(detail, list):
        return [m for value in detail for m in _flat_messages(value, prefix)]
    return [f"{prefix}{detail}"]


def _label(key: Any) -> str:
    return f"item {key}" if isinstance(key, int) or str(key).isdigit() else str(key)


class AwareDateTimeField(serializers.Field):
    """ISO 8601 with an explicit offset or Z. A naive time is refused: guessing its zone loses fires."""

    default_error_messages = INSTANT_ERRORS

    def to_internal_value(self, data: Any) -> datetime:
        try:
            return parse_instant(data)
        except InstantInvalid as exc:
            self.fail(exc.code)

    def to_representation(self, value: datetime) -> str:
        return utc_text(value)


def utc_text(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


class JSONObjectField(serializers.JSONField):
    """A JSON object whose nesting is bounded (see MAX_JSON_DEPTH); form input parses it from text."""

    default_error_messages = {
        "not_object": "Must be a JSON object.",
        "too_deep": f"Nested deeper than {MAX_JSON_DEPTH} levels.",
    }

    def to_internal_value(self, data: Any) -> Any:
        # Form input arrives as text that DRF parses itself, outside the bounded JSON parser.
        try:
            value = super().to_internal_value(data)
        except RecursionError:
            self.fail("too_deep")
        if not isinstance(value, dict):
            self.fail("not_object")
        if json_depth_exceeds(value):
            self.fail("too_deep")
        return value


class LabelsField(JSONObjectField):
    """Labels: an object of string pairs, whose rules (core/labels.py) the services check."""


def _int_field(name: str) -> serializers.IntegerField:
    low, high = NUMERIC_RANGES[name]
    return serializers.IntegerField(required=False, min_value=low, max_value=high)


def _choice_field(choices: type[TextChoices], *, allow_null: bool = False) -> serializers.ChoiceField:
    # The message names the choices, not the input: DRF's default echoes it, and an input holding an unpaired
    # surrogate then fails to encode as the UTF-8 response (a 500 instead of a 400). The model's own choices, so
    # the API schema names one enum per set of values (KindEnum), whichever serializer shows it.
    return serializers.ChoiceField(
        choices=choices.choices,
        required=False,
        allow_null=allow_null,
        error_messages={"invalid_choice": f"Must be one of: {', '.join(choices.values)}."},
    )


# Text fields whose rules the services check (with messages that list what is accepted); distinct classes so the
# API schema can show those rules (schedules/api/schema.py).
class CronExpressionField(serializers.CharField):
    """A cron expression or macro (core.cron_syntax)."""


class HandlerNameField(serializers.CharField):
    """The name of a registered handler (dispatch.handlers)."""


class TimezoneNameField(serializers.CharField):
    """An IANA time zone name (core.timerules.parse_timezone)."""


def of_its_json_type(field: serializers.Field, value: Any) -> bool:
    """Text fields take JSON strings, integer fields JSON integers (5.0 is one too, a boolean is not), boolean
    fields JSON booleans, list fields JSON arrays."""
    if isinstance(field, serializers.BooleanField):
        return isinstance(value, bool)
    if isinstance(field, serializers.CharField):
        return isinstance(value, str)
    if isinstance(field, serializers.ListField) and isinstance(field.child, serializers.CharField):
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    if isinstance(field, serializers.ListField):
        return isinstance(value, list)
    if isinstance(field, serializers.IntegerField):
        if isinstance(value, bool):
            return False
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    return True


def _printable(text: str) -> str:
    """`text` as it can be written into a UTF-8 response: unpaired surrogates become backslash escapes."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class ScheduleInputSerializer(serializers.Serializer):
    """Create and PATCH bodies. Every field is optional here; required-ness depends on kind (services)."""

    name = serializers.CharField(required=False, max_length=200)
    kind = _choice_field(Kind)
    cron = CronExpressionField(required=False, allow_null=True, allow_blank=True, max_length=200)
    run_at = AwareDateTimeField(required=False, allow_null=True)
    every_seconds = serializers.IntegerField(
        required=False, allow_null=True, min_value=EVERY_SECONDS_RANGE[0], max_value=EVERY_SECONDS_RANGE[1]
    )
    anchor_at = AwareDateTimeField(required=False, allow_null=True)
    timezone = TimezoneNameField(required=False, max_length=64)
    dst_gap = _choice_field(DstGap, allow_null=True)
    dst_repeat = _choice_field(DstRepeat, allow_null=True)
    start_at = AwareDateTimeField(required=False, allow_null=True, help_text="No fire before this instant (included).")
    end_at = AwareDateTimeField(
        required=False,
        allow_null=True,
        help_text="No fire after this instant (included); once it has passed and nothing is pending, the schedule is "
        "completed. Not before start_at.",
    )
    max_runs = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=MAX_RUNS,
        help_text="Only the first max_runs fires exist (missed ones count, manual triggers do not); then the schedule "
        "is completed.",
    )
    exclude_calendars = FlatListField(
        child=serializers.RegexField(NAME_REGEX, max_length=63),
        required=False,
        allow_null=True,
        max_length=MAX_CALENDARS_PER_SCHEDULE,
        help_text="Names of the tenant's calendars (/api/v1/calendars/): a fire whose local date (in this schedule's "
        "zone) is one of their dates, or whose instant lies in one of their ranges, does not exist. A name the "
        "tenant has no calendar of is a 400.",
    )
    lane = _choice_field(Lane)
    flexible_window_seconds = _int_field("flexible_window_seconds")
    priority = _int_field("priority")
    handler = HandlerNameField(required=False, max_length=100)
    payload = JSONObjectField(
        required=False,
        help_text="Given to the handler. A handler may check it when the schedule is saved (the webhook's rules: "
        'docs/API.md, "Handlers"); a payload it refuses is a 400 naming payload.',
    )
    misfire_policy = _choice_field(MisfirePolicy)
    max_lateness_seconds = _int_field("max_lateness_seconds")
    catchup_limit = _int_field("catchup_limit")
    overlap_policy = _choice_field(OverlapPolicy)
    max_attempts = _int_field("max_attempts")
    retry_base_seconds = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=RETRY_RANGES["retry_base_seconds"][0],
        max_value=RETRY_RANGES["retry_base_seconds"][1],
        help_text="A transient failure's wait before attempt n+1 is between half and all of min(retry_cap_seconds, "
        "retry_base_seconds x 2^(n-1)), raised to the target's Retry-After; retries end at max_attempts or at the "
        "occurrence deadline. Null: the platform's default (2 s).",
    )
    retry_cap_seconds = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=RETRY_RANGES["retry_cap_seconds"][0],
        max_value=RETRY_RANGES["retry_cap_seconds"][1],
        help_text="The longest wait between attempts; not below retry_base_seconds. Null: the platform's default "
        "(300 s).",
    )
    labels = LabelsField(
        required=False,
        help_text="The schedule's own tags, chosen by `?selector=` on the list, by bulk changes, export/apply and "
        "notification targets. A PATCH replaces the whole object ({} removes every label).",
    )

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(DEFINITION_FIELDS) - READ_ONLY_KEYS - self.extra_keys())
            if unknown:
                raise serializers.ValidationError({_printable(key): ["Unknown field."] for key in unknown})
            self._refuse_read_only_changes(data)
            if not isinstance(data, QueryDict):
                self._refuse_other_json_types(data)
        values = super().to_internal_value(data)
        kept = set(DEFINITION_FIELDS) | self.extra_keys()
        return {key: value for key, value in values.items() if key in kept}

    def extra_keys(self) -> set[str]:
        return set()

    def _refuse_other_json_types(self, data: dict[str, Any]) -> None:
        """A JSON body gives each field its own JSON type. DRF alone would read the number 5 as the name "5" and
        the text "5" as the priority 5: input the API schema calls invalid. JSON calls 5.0 an integer too. (Form
        input is all text; the fields parse it.)"""
        errors = {}
        for name, field in self.fields.items():
            value = data.get(name)
            # Absent or null: the field's own allow_null decides.
            if value is not None and not of_its_json_type(field, value):
                message = field.error_messages.get("invalid") or field.error_messages.get("not_a_list", "Invalid.")
                errors[name] = [message.format(input_type=type(value).__name__)]
        if errors:
            raise serializers.ValidationError(errors)

    def _refuse_read_only_changes(self, data: dict[str, Any]) -> None:
        """Read-only keys may only repeat the stored value (context "current": the schedule as the API shows it);
        without a stored schedule (create, preview) they are refused."""
        current = self.context.get("current")
        changed = sorted(key for key in READ_ONLY_KEYS & set(data) if current is None or data[key] != current.get(key))
        if changed:
            raise serializers.ValidationError(
                {key: [READ_ONLY_HINTS.get(key, "Read-only: set by the server.")] for key in changed}
            )


class PreviewInputSerializer(ScheduleInputSerializer):
    """An unsaved definition plus where the preview starts and how many fires it lists."""

    after = AwareDateTimeField(required=False)
    count = serializers.IntegerField(required=False, min_value=1, max_value=MAX_PREVIEW_COUNT, default=10)

    def extra_keys(self) -> set[str]:
        return {"after", "count"}

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        values = super().to_internal_value(data)
        after = values.pop("after", None)
        count = values.pop("count", 10)
        return {"definition": values, "after": after, "count": count}


class NoteInputSerializer(serializers.Serializer):
    """POST .../resume/ and .../cancel/ (and DELETE): why, in the actor's words, kept on the new version."""

    note = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")


class PauseInputSerializer(NoteInputSerializer):
    """POST .../pause/: why (kept on the new version), and when to resume by itself."""

    resume_at = AwareDateTimeField(
        required=False,
        allow_null=True,
        default=None,
        help_text="When the schedule resumes by itself, as a resume would (fires of the pause are not caught up), "
        "as a new version whose note says so. Must be in the future.",
    )


class PreviewQuerySerializer(serializers.Serializer):
    after = AwareDateTimeField(required=False)
    count = serializers.IntegerField(required=False, min_value=1, max_value=MAX_PREVIEW_COUNT, default=10)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        # DRF reads an empty query value of an optional field as absent: `?after=` would preview from now, as
        # if the client had not asked for an instant it did name (empty). Refused as what it is.
        empty = [name for name in ("after", "count") if hasattr(data, "get") and data.get(name) == ""]
        if empty:
            raise serializers.ValidationError({name: ["Give a value, or leave the parameter out."] for name in empty})
        return super().to_internal_value(data)


class ScheduleSerializer(serializers.ModelSerializer):
    run_at = AwareDateTimeField(allow_null=True)
    anchor_at = AwareDateTimeField(allow_null=True)
    start_at = AwareDateTimeField(allow_null=True)
    end_at = AwareDateTimeField(allow_null=True)
    resume_at = AwareDateTimeField(allow_null=True)
    next_run_at = serializers.SerializerMethodField()
    remaining_runs = serializers.SerializerMethodField()
    created_at = AwareDateTimeField()
    updated_at = AwareDateTimeField()

    class Meta:
        model = Schedule
        fields = [
            *("id", *DEFINITION_FIELDS, "remaining_runs", "state", "resume_at", "version", "next_run_at"),
            *("created_at", "updated_at"),
        ]
        read_only_fields = fields

    @extend_schema_field(serializers.IntegerField(allow_null=True, min_value=0))
    def get_remaining_runs(self, schedule: Schedule) -> int | None:
        """Under max_runs, the fires not yet written (the materializer writes each up to its horizon before it is
        due); 0 once the last is written. None without max_runs."""
        return schedule.remaining_runs_now

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_next_run_at(self, schedule: Schedule) -> str | None:
        """The next fire not yet handed to the broker: the earliest pending occurrence, else the cursor (which
        runs a horizon ahead of the real next fire). None when nothing will fire."""
        annotated = getattr(schedule, "next_pending_fire", _NOT_LOADED)
        pending = earliest_pending_fire(schedule.id, db_now()) if annotated is _NOT_LOADED else annotated
        candidates: list[datetime] = [pending] if isinstance(pending, datetime) else []
        if schedule.state == ScheduleState.ACTIVE and schedule.next_run_at is not None:
            candidates.append(schedule.next_run_at)
        if schedule.state in (ScheduleState.PAUSED, ScheduleState.CANCELED) or not candidates:
            return None
        return utc_text(min(candidates))


def fires_json(fires: list[datetime], rule: TimeRule) -> dict[str, list[dict[str, str]]]:
    """A preview's fires: UTC, local, and on a fire a clock change touches, how ("dst": TimeRule.dst_mark)."""
    shown = []
    for fire in fires:
        entry = {"at": utc_text(fire), "local": local_time(fire, rule.timezone).isoformat()}
        mark = rule.dst_mark(fire)
        if mark is not None:
            entry["dst"] = mark
        shown.append(entry)
    return {"fires": shown}


class AttemptSerializer(serializers.ModelSerializer):
    started_at = AwareDateTimeField()
    finished_at = AwareDateTimeField(allow_null=True)

    class Meta:
        model = Attempt
        fields = ["generation", "started_at", "finished_at", "outcome", "error"]
        read_only_fields = fields


class OccurrenceSerializer(serializers.ModelSerializer):
    schedule_id = serializers.UUIDField(read_only=True)
    scheduled_for = AwareDateTimeField()
    available_at = AwareDateTimeField()
    enqueued_at = AwareDateTimeField(allow_null=True)
    finished_at = AwareDateTimeField(allow_null=True)
    attempts = AttemptSerializer(many=True, read_only=True)

    class Meta:
        model = Occurrence
        fields = [
            "occurrence_id",
            "schedule_id",
            "schedule_version",
            "scheduled_for",
            "available_at",
            "lane",
            "state",
            "attempt_count",
            "enqueued_at",
            "finished_at",
            "attempts",
        ]
        read_only_fields = fields


class InFlightSerializer(serializers.Serializer):
    occurrence_id = serializers.UUIDField()
    state = serializers.ChoiceField(choices=OccurrenceState.choices)


class OccurrenceIdSerializer(serializers.Serializer):
    occurrence_id = serializers.UUIDField()
