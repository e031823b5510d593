"""Which state changes a schedule's verbs make, leave alone or refuse, in one table: the services apply it under
the row lock, and a bulk dry run (schedules.fleet) reads it to say what a change would do without making it."""

from __future__ import annotations

from core.choices import ScheduleState

# Per verb: the states it changes, and the states it leaves as they are (a no-op, not an error); any other is
# refused with the verb's message.
CHANGES: dict[str, frozenset[str]] = {
    "pause": frozenset({ScheduleState.ACTIVE}),
    "resume": frozenset({ScheduleState.PAUSED}),
    # A one-off that fired stays completed: canceling it withdraws nothing and must not erase that it ran.
    "cancel": frozenset({ScheduleState.ACTIVE, ScheduleState.PAUSED}),
    "trigger": frozenset({ScheduleState.ACTIVE, ScheduleState.PAUSED, ScheduleState.COMPLETED}),
}
LEAVES: dict[str, frozenset[str]] = {
    "pause": frozenset({ScheduleState.PAUSED}),
    "resume": frozenset({ScheduleState.ACTIVE}),
    "cancel": frozenset({ScheduleState.CANCELED, ScheduleState.COMPLETED}),
    "trigger": frozenset(),
}
REFUSED: dict[str, str] = {
    "pause": "Only an active schedule can be paused; this one is {state}.",
    "resume": "Only a paused schedule can be resumed; this one is {state}.",
    "cancel": "",
    "trigger": "A canceled schedule cannot be triggered.",
}
# The state a change leaves (resume: active, or completed when no fire is left; the service decides).
STATE_AFTER: dict[str, str | None] = {
    "pause": ScheduleState.PAUSED,
    "resume": ScheduleState.ACTIVE,
    "cancel": ScheduleState.CANCELED,
    "trigger": None,
}


def refusal(verb: str, state: str) -> str | None:
    """Why `verb` cannot be applied to a schedule in `state`; None when it can (as a change or a no-op)."""
    if state in CHANGES[verb] or state in LEAVES[verb]:
        return None
    return REFUSED[verb].format(state=state)


def changes(verb: str, state: str) -> bool:
    return state in CHANGES[verb]
