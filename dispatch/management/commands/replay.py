"""`manage.py replay --dead [--tenant SLUG]`, `replay <occurrence_id>` or `replay --stuck [--older-than S]
[--since ISO] [--tenant SLUG]`: re-enqueue from the DLQ, or re-drive what is stuck, always under the same ids."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from core.clock import db_now
from dispatch.errors import ReconcileInputError, ReplayRefused
from dispatch.occurrences import replay_dead, replay_one, replay_stuck
from dispatch.reconcile import parse_instant
from dispatch.stuck import DEFAULT_STUCK_AFTER_SECONDS
from tenants.models import Tenant


class Command(BaseCommand):
    help = (
        "Re-enqueue dead occurrences under their own occurrence ids (all with --dead, or one by id), or re-publish "
        "the stuck ones (--stuck: not done long after they were due, as reconcile reports them)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("occurrence_id", nargs="?", help="replay this one dead occurrence")
        parser.add_argument(
            "--dead",
            action="store_true",
            help="replay every dead occurrence in the DLQ (one an operator resolved is left)",
        )
        parser.add_argument("--stuck", action="store_true", help="re-publish every stuck occurrence")
        parser.add_argument(
            "--older-than",
            type=float,
            metavar="SECONDS",
            help=f"with --stuck: stuck this long after they were due (default {DEFAULT_STUCK_AFTER_SECONDS})",
        )
        parser.add_argument(
            "--since",
            help="with --stuck: only occurrences scheduled from this instant on (ISO 8601; default: the retention)",
        )
        parser.add_argument("--tenant", help="with --dead or --stuck: only this tenant's occurrences (slug)")

    def handle(self, *args, **options) -> None:
        occurrence_text, dead, stuck = options["occurrence_id"], options["dead"], options["stuck"]
        tenant_slug = options["tenant"]
        if sum((bool(occurrence_text), dead, stuck)) != 1:
            raise CommandError("Give exactly one of --dead, --stuck or an occurrence id.")
        if not stuck and (options["older_than"] is not None or options["since"]):
            raise CommandError("--older-than and --since go with --stuck.")
        if tenant_slug and occurrence_text:
            raise CommandError("--tenant goes with --dead or --stuck; an occurrence id already names one occurrence.")

        if occurrence_text:
            self._replay_one(occurrence_text)
            return
        tenant_id = self._tenant_id(tenant_slug)
        if stuck:
            self._replay_stuck(options["older_than"], options["since"], tenant_id)
            return
        result = replay_dead(tenant_id=tenant_id)
        self.stdout.write(f"Replayed {result.replayed} dead occurrences.")
        if result.left_canceled:
            self.stdout.write(
                f"Left {result.left_canceled} dead occurrences of canceled schedules: they would not run "
                "(resolve them in the console to take them out of the dead-letter queue)."
            )

    def _replay_one(self, occurrence_text: str) -> None:
        try:
            occurrence_id = uuid.UUID(occurrence_text)
        except ValueError:
            raise CommandError(f"{occurrence_text!r} is not an occurrence id (a UUID).") from None
        try:
            occurrence = replay_one(occurrence_id)
        except ReplayRefused as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"Replayed occurrence {occurrence.occurrence_id} (now {occurrence.state}).")

    def _tenant_id(self, slug: str | None) -> int | None:
        if not slug:
            return None
        tenant = Tenant.objects.filter(slug=slug).first()
        if tenant is None:
            raise CommandError(f"Unknown tenant {slug!r}.")
        return tenant.id

    def _replay_stuck(self, older_than: float | None, since_text: str | None, tenant_id: int | None) -> None:
        if older_than is None:
            older_than = DEFAULT_STUCK_AFTER_SECONDS
        if not (0 <= older_than < float("inf")):
            raise CommandError(f"--older-than must be a number of seconds >= 0, not {older_than}.")
        now = db_now()
        try:
            since = parse_instant(since_text, "--since") if since_text else None
        except ReconcileInputError as exc:
            raise CommandError(str(exc)) from None
        # Older rows are pruned with their day partitions: nothing older can be stuck.
        since = since or now - timedelta(days=settings.SCHEDULER_RETENTION_DAYS)
        with tqdm(desc="re-publishing stuck occurrences", unit="occ", file=self.stderr, disable=None) as bar:
            result = replay_stuck(
                older_than_seconds=older_than, since=since, tenant_id=tenant_id, now=now, progress=bar.update
            )
        by_state = ", ".join(f"{state} {count}" for state, count in result.by_state.items()) or "none"
        self.stdout.write(
            f"Re-published {result.republished} stuck occurrences ({by_state}) under their own ids; "
            "workers run each at most once more."
        )
