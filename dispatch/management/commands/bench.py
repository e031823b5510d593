"""`manage.py bench burst ...`: benchmarks operators use to size a deployment (docs/BENCHMARKS.md)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatch.bench import BenchRefused, BurstBenchmark, BurstConfig, result_line


class Command(BaseCommand):
    help = "Benchmarks. `bench burst`: N fires due at one instant through the real materializer and relay."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="bench", required=True)
        burst = sub.add_parser("burst", help="top-of-hour burst: lag from scheduled time to broker confirmation")
        burst.add_argument("--schedules", type=int, required=True, help="fires due at the same instant")
        burst.add_argument("--tenants", type=int, default=1, help="tenants the fires are spread over")
        burst.add_argument("--lane", choices=["strict", "flexible"], default="strict")
        burst.add_argument("--materializers", type=int, default=1)
        burst.add_argument("--relays", type=int, default=1)
        burst.add_argument("--idle", type=int, default=0, help="extra schedules that never fall due in the run")
        burst.add_argument("--deadline", type=float, default=120.0, help="seconds after T0 before giving up")
        burst.add_argument("--keep", action="store_true", help="keep the bench rows for inspection")

    def handle(self, *args, **options) -> None:
        if options["bench"] == "burst":
            for name in ("schedules", "tenants", "materializers", "relays"):
                if options[name] < 1:
                    raise CommandError(f"--{name} must be at least 1")
            if options["idle"] < 0:
                raise CommandError("--idle must not be negative")
            if options["tenants"] > 50:
                raise CommandError("--tenants is limited to 50 (each bench tenant gets its own schema)")
            config = BurstConfig(
                schedules=options["schedules"],
                tenants=options["tenants"],
                lane=options["lane"],
                materializers=options["materializers"],
                relays=options["relays"],
                idle=options["idle"],
                deadline_seconds=options["deadline"],
                keep=options["keep"],
            )
            try:
                result = BurstBenchmark(config, out=self.stdout).run()
            except BenchRefused as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write(result_line(result))
