"""`manage.py import_celery_beat --from-database URL --tenant SLUG [--handler-map TASK=HANDLER ...] [--dry-run]`:
django-celery-beat's periodic tasks, read from the PostgreSQL database at URL, become the tenant's schedules.

The last line printed is one JSON object: {"imported", "updated", "skipped": [{"name", "reason"}], "unchanged",
"warnings": [{"name", "warning"}], "dry_run"}; lines before it say what happened to each task. Exit status 0 even
when tasks were skipped (the skips are the report); a refused argument or an unreadable database is a one-line
error, exit 1. The mapping lives in schedules/celery_beat.py; what follows is why it is what it is.

Reading. Beat's tables are read with one read-only SQL query (a consistent snapshot; the beat database is never
written), so django-celery-beat need not be installed here. The tables are looked up on the URL's search_path
(public by default; `?options=-csearch_path%3DNAME` for another schema). Tasks are taken in id order.

Time. crontab -> cron in the crontab's own timezone. Celery's parser reads each field (what beat runs by); a field
this product reads as the same values keeps its text ("*/15", "mon-fri"), any other is written out as a list (a
range celery wraps, "fri-mon", becomes "0-1,5-6"). Celery fires on days matching day_of_month AND day_of_week,
cron on days matching either when both are restricted: such a pair is kept only when one side is every day,
otherwise the task is skipped with the reason. The product's own rules then check the expression (clean_definition);
its refusal is the skip reason, word for word. interval -> interval of days/hours/minutes/seconds in seconds
(microseconds only when a whole number of seconds). Beat counts an interval from its last run; here an interval has
a fixed phase, anchor_at: the task's start_time when it has one, else the instant of the import (which a later
import keeps). clocked -> once at clocked_time; a disabled one whose time has passed is skipped (it ran, or never
will), an enabled one is created and the misfire policy decides at once (a warning says so). solar -> skipped:
nothing here fires by the sun. start_time -> start_at, expires -> end_at (end_at includes its instant; beat stops at
it: one fire landing exactly on `expires` is the only difference). A task with no fire left in its window is
skipped rather than created completed. one_off -> max_runs=1 for cron and interval (beat disables a one-off after
its first run; a once is once anyway).

What runs. The task name is the handler when it is a registered handler; `--handler-map TASK=HANDLER` maps
another (and overrides). Any other task is skipped, naming the flag to use. The payload is
{"args": [...], "kwargs": {...}} from beat's JSON columns (invalid JSON, or not an array/object: skipped); the
handler's own payload check applies (a webhook needs a url). Lane, priority, misfire policy, retries and overlap get
the product's defaults at creation and are the operator's afterwards: an import never resets them. queue, exchange,
routing_key, priority (a broker message priority), expire_seconds (a message TTL) and headers have no meaning here:
each is listed in "warnings", never a reason to skip. description, last_run_at and total_run_count are not kept.

Idempotence. A task is matched by name with the tenant's one non-canceled schedule of that name (several: skipped,
the import cannot tell which). Its fields that the task decides (kind and time fields, timezone, start/end,
max_runs, handler, payload) are compared with the mapped ones; only a difference is an update (one new version,
counted in "updated"), so a second run of an unchanged beat imports nothing and updates nothing ("unchanged").

enabled. A disabled task is created and then paused. Afterwards the schedule follows `enabled` (pause or resume,
counted as an update) only while the import set its state itself: a pause or resume by anyone else (API, console,
a resume_at) wins, and a warning says so. To hand over from beat, stop beat rather than disabling its tasks and
importing again: a disabled task imports as paused.

Writing. Every change goes through schedules.services (create_schedule, update_schedule, pause_schedule,
resume_schedule), with their checks, quota and versions; the actor is `import:celery-beat/task-<id>` (the services
take no note on create and update, so the periodic task's id travels in the actor; pauses and resumes also carry a
note naming it). Each task is imported in a transaction of its own: all of it or none, and a failure (quota, a
refused definition) skips that task only. --dry-run runs exactly the same steps inside one transaction that is
rolled back: its counts are a real run's, nothing is written (it holds the tenant's row lock until it ends).
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatch.services import is_registered, registered_names
from schedules.celery_beat import BeatSourceError, import_tasks, read_beat_tasks
from tenants.models import Tenant


class Command(BaseCommand):
    help = (
        "Import django-celery-beat's periodic tasks (crontab, interval, clocked) from its PostgreSQL database as a "
        "tenant's schedules. Idempotent by task name; the last line is one JSON object."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--from-database", required=True, metavar="URL", help="the celery-beat project's PostgreSQL URL"
        )
        parser.add_argument("--tenant", required=True, metavar="SLUG", help="the tenant whose schedules they become")
        parser.add_argument(
            "--handler-map",
            action="extend",
            nargs="+",
            default=[],
            metavar="TASK=HANDLER",
            help="run celery task TASK with registered handler HANDLER (repeatable)",
        )
        parser.add_argument("--dry-run", action="store_true", help="report what would be done, write nothing")

    def handle(self, *args: Any, **options: Any) -> None:
        handler_map = self._handler_map(options["handler_map"])
        tenant = Tenant.objects.filter(slug=options["tenant"]).exclude(schema_name="public").first()
        if tenant is None:
            raise CommandError(f"Unknown tenant {options['tenant']!r}.")
        try:
            rows = read_beat_tasks(options["from_database"])
        except BeatSourceError as exc:
            raise CommandError(str(exc)) from None
        report = import_tasks(tenant, rows, handler_map, dry_run=options["dry_run"])
        for line in report.lines:
            self.stdout.write(line)
        self.stdout.write(json.dumps(report.as_json()))

    def _handler_map(self, pairs: list[str]) -> dict[str, str]:
        """TASK=HANDLER pairs, each handler registered, no task mapped twice to different handlers."""
        mapping: dict[str, str] = {}
        for pair in pairs:
            task, sep, handler = (part.strip() for part in pair.partition("="))
            if not sep or not task or not handler:
                raise CommandError(f"--handler-map takes TASK=HANDLER, not {pair!r}.")
            if not is_registered(handler):
                raise CommandError(
                    f"--handler-map {pair}: unknown handler {handler!r}. Registered: {', '.join(registered_names())}."
                )
            if mapping.get(task, handler) != handler:
                raise CommandError(f"--handler-map maps {task!r} twice: to {mapping[task]!r} and to {handler!r}.")
            mapping[task] = handler
        return mapping
