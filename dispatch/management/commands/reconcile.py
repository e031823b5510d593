"""`manage.py reconcile --since ISO --until ISO [--tenant SLUG] [--stuck-after S] [--grace S] [--json]`: expected vs
actual occurrences, and the ones stuck on the way."""

from __future__ import annotations

import json
import sys

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatch.errors import ReconcileInputError
from dispatch.reconcile import RECONCILE_GRACE_SECONDS, ReconcileReport, parse_instant, reconcile
from dispatch.stuck import DEFAULT_STUCK_AFTER_SECONDS
from tenants.models import Tenant

# Gaps printed by the command; the report's counts are always complete.
LISTED_GAPS = 50


class Command(BaseCommand):
    help = (
        "Recompute the fires owed in [since, until) from schedule version history and the time rules, compare them "
        "with the occurrence rows, and list the gaps and the stuck occurrences. Exit code 1 when any expected fire "
        "has no row or any occurrence is stuck."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", required=True, help="window start, ISO 8601 with offset or Z (inclusive)")
        parser.add_argument("--until", required=True, help="window end, ISO 8601 with offset or Z (exclusive)")
        parser.add_argument("--tenant", help="only this tenant's schedules (slug)")
        parser.add_argument(
            "--stuck-after",
            type=float,
            metavar="SECONDS",
            help=f"report occurrences not done this long after they were due (default {DEFAULT_STUCK_AFTER_SECONDS})",
        )
        parser.add_argument(
            "--grace",
            type=float,
            metavar="SECONDS",
            default=RECONCILE_GRACE_SECONDS,
            help="fires due less than this long ago are not checked for gaps, since the materializer may still be "
            f"writing them (default {RECONCILE_GRACE_SECONDS}); 0 once every process is known to have caught up",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object instead of the summary")

    def handle(self, *args, **options) -> None:
        try:
            since = parse_instant(options["since"], "--since")
            until = parse_instant(options["until"], "--until")
        except ReconcileInputError as exc:
            raise CommandError(str(exc)) from None
        if since >= until:
            raise CommandError(f"--since ({options['since']}) must be before --until ({options['until']}).")
        stuck_after = options["stuck_after"]
        if stuck_after is not None and not (0 <= stuck_after < float("inf")):
            raise CommandError(f"--stuck-after must be a number of seconds >= 0, not {stuck_after}.")
        grace = options["grace"]
        if not (0 <= grace < float("inf")):
            raise CommandError(f"--grace must be a number of seconds >= 0, not {grace}.")
        tenant_id = None
        if options["tenant"]:
            tenant = Tenant.objects.filter(slug=options["tenant"]).first()
            if tenant is None:
                raise CommandError(f"Unknown tenant {options['tenant']!r}.")
            tenant_id = tenant.id

        report = reconcile(
            since=since, until=until, tenant_id=tenant_id, stuck_after_seconds=stuck_after, grace_seconds=grace
        )
        if options["json"]:
            payload = report.as_dict(gap_limit=LISTED_GAPS)
            payload["tenant"] = options["tenant"]
            self.stdout.write(json.dumps(payload))
        else:
            self._summary(report, options["tenant"], grace)
        if not report.ok:
            # Exit code 1 is the contract (docs/API.md, "Commands"): monitoring runs this and alerts on it.
            sys.exit(1)

    def _summary(self, report: ReconcileReport, tenant: str | None, grace: float) -> None:
        d = report.as_dict()
        scope = f"tenant {tenant}" if tenant else "all tenants"
        self.stdout.write(f"Reconciled {d['since']} .. {d['until']} ({scope})")
        if report.checked_until < report.until:
            self.stdout.write(
                f"  checked up to {d['checked_until']}: fires younger than {grace:g} s may not be materialized yet"
            )
        self.stdout.write(f"  schedules {report.schedules}, versions {report.versions}")
        by_state = ", ".join(f"{state} {count}" for state, count in d["found_by_state"].items()) or "none"
        self.stdout.write(f"  expected {report.expected}, found {report.found} ({by_state}), missing {report.missing}")
        if report.unexpected:
            by_state = ", ".join(f"{state} {count}" for state, count in d["unexpected_by_state"].items())
            self.stdout.write(
                f"  unexpected rows (informational: not owed by any version, e.g. canceled by a newer one): "
                f"{report.unexpected} ({by_state})"
            )
        for version in report.unreadable_versions:
            self.stdout.write(
                self.style.ERROR(
                    f"UNREADABLE: schedule {version.schedule_id} v{version.version}: {version.error} "
                    "(its fires cannot be recomputed)"
                )
            )
        if report.stuck:
            by_state = ", ".join(f"{state} {count}" for state, count in d["stuck_by_state"].items())
            self.stdout.write(
                self.style.ERROR(
                    f"STUCK: {report.stuck} occurrences not done {report.stuck_after_seconds:.0f} s after they were "
                    f"due ({by_state}); re-drive them with `manage.py replay --stuck`."
                )
            )
            for row in report.stuck_samples[:LISTED_GAPS]:
                self.stdout.write(
                    f"  occurrence {row.occurrence_id} ({row.state}, {row.stuck_for_seconds:.0f} s) of schedule "
                    f"{row.schedule_id} at {row.as_dict()['scheduled_for']}"
                )
            if report.stuck > LISTED_GAPS:
                self.stdout.write(f"  ... and {report.stuck - LISTED_GAPS} more")
        if report.ok:
            self.stdout.write(self.style.SUCCESS("OK: every expected occurrence is accounted for."))
            return
        if not report.missing:
            return
        self.stdout.write(
            self.style.ERROR(
                f"GAPS: {report.missing} expected occurrences have no row "
                f"({report.schedules_with_gaps} schedules); backfill them with `manage.py backfill`."
            )
        )
        for gap in report.gaps[:LISTED_GAPS]:
            self.stdout.write(
                f"  schedule {gap.schedule_id} v{gap.version} at {gap.as_dict()['scheduled_for']} "
                f"-> occurrence {gap.occurrence_id}"
            )
        if report.missing > LISTED_GAPS:
            self.stdout.write(f"  ... and {report.missing - LISTED_GAPS} more (use --json or a narrower window)")
