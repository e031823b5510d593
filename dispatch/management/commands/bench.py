"""`manage.py bench burst|drain|fairness|fleet|steady|peer-beat|celery-noop ...`: benchmarks that size a deployment.

The commands and measured figures are in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dispatch.bench.burst import BurstBenchmark, BurstConfig
from dispatch.bench.celery_noop import CeleryNoopBenchmark, CeleryNoopConfig
from dispatch.bench.drain import DrainBenchmark, DrainConfig
from dispatch.bench.fairness import FairnessBenchmark, FairnessConfig
from dispatch.bench.fleet import FleetBenchmark, FleetConfig
from dispatch.bench.peer_beat import (
    INSTALL_HINT,
    PeerBeatBenchmark,
    PeerBeatConfig,
    PeerRefused,
    beat_in_settings,
    beat_installed,
    run_under_bench_settings,
)
from dispatch.bench.processes import result_line
from dispatch.bench.rows import BenchRefused
from dispatch.bench.steady import SteadyBenchmark, SteadyConfig


class Command(BaseCommand):
    help = (
        "Benchmarks. `bench burst`: N fires due at one instant through the real materializer and relay. "
        "`bench drain`: the burst through real workers. `bench steady`: R fires a second for M minutes through every "
        "process, with bursts. `bench peer-beat`: the same N tasks under django-celery-beat, "
        "for comparison. `bench celery-noop`: a plain Celery worker running a noop task, one message each."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="bench", required=True)
        burst = sub.add_parser("burst", help="top-of-hour burst: lag from scheduled time to broker confirmation")
        burst.add_argument("--schedules", type=int, required=True, help="fires due at the same instant")
        burst.add_argument("--tenants", type=int, default=1, help="tenants the fires are spread over")
        burst.add_argument("--lane", choices=["strict", "flexible"], default="strict")
        burst.add_argument("--materializers", type=int, default=1)
        burst.add_argument("--relays", type=int, default=1)
        burst.add_argument("--idle", type=int, default=0, help="extra schedules that never fall due in the run")
        burst.add_argument(
            "--calendar-dates",
            type=int,
            default=0,
            help="give each tenant a holiday calendar of this many dates (none on the run's day) and have every due "
            "schedule name it: the materializer's calendar path at full load",
        )
        burst.add_argument("--deadline", type=float, default=120.0, help="seconds after T0 before giving up")
        burst.add_argument("--keep", action="store_true", help="keep the bench rows for inspection")
        burst.add_argument(
            "--keep-idle",
            action="store_true",
            help="keep the idle schedules for the next run, and reuse an earlier run's when as many are stored",
        )
        burst.add_argument("--lags-out", type=Path, default=None, help="write each fire's lag (s), one per line")
        drain = sub.add_parser("drain", help="the burst through real workers: execution rate and lag to the effect")
        drain.add_argument("--occurrences", type=int, required=True, help="fires due at the same instant")
        drain.add_argument("--workers", type=int, default=1, help="Celery worker processes")
        drain.add_argument("--concurrency", type=int, default=1, help="pool processes per worker")
        drain.add_argument("--tenants", type=int, default=1)
        drain.add_argument("--materializers", type=int, default=1)
        drain.add_argument("--relays", type=int, default=1)
        drain.add_argument("--handler", choices=["bench_effect", "noop"], default="bench_effect")
        drain.add_argument("--kill-one-of-each", action="store_true", help="SIGKILL a materializer, relay and worker")
        drain.add_argument("--deadline", type=float, default=300.0, help="seconds after T0 before giving up")
        fleet = sub.add_parser("fleet", help="bulk, export and apply on N schedules through the tenant API")
        fleet.add_argument("--schedules", type=int, required=True, help="schedules of the fleet (at most 10,000)")
        fair = sub.add_parser("fairness", help="a big and a small tenant due at one instant: each one's lag")
        fair.add_argument("--big", type=int, required=True, help="fires of the big tenant")
        fair.add_argument("--small", type=int, required=True, help="fires of the small tenant")
        fair.add_argument(
            "--big-fires-per-second", type=int, default=None, help="hold the big tenant to this max_fires_per_second"
        )
        fair.add_argument("--materializers", type=int, default=1)
        fair.add_argument("--relays", type=int, default=1)
        fair.add_argument("--deadline", type=float, default=120.0, help="seconds after T0 before giving up")
        steady = sub.add_parser(
            "steady", help="R fires a second for M minutes through the real processes, with bursts: a production day"
        )
        steady.add_argument("--rate", type=int, required=True, help="fires due in every second of the window")
        steady.add_argument("--tenants", type=int, required=True, help="tenants the fires are spread over")
        steady.add_argument("--minutes", type=float, required=True, help="length of the measured window")
        steady.add_argument("--burst", type=int, default=0, help="strict fires more at each whole 10 minutes")
        steady.add_argument("--workers", type=int, default=1, help="Celery worker processes")
        steady.add_argument("--concurrency", type=int, default=2, help="pool processes per worker")
        steady.add_argument(
            "--period", type=int, default=60, help="every_seconds of the interval schedules (rate x period of them)"
        )
        steady.add_argument("--series-out", type=Path, default=None, help="write the sampled series as CSV")
        steady.add_argument("--keep", action="store_true", help="keep the bench rows for inspection")
        for lane_bench in (burst, drain, steady):
            lane_bench.add_argument(
                "--queue-type",
                choices=["classic", "quorum"],
                default="classic",
                help="RabbitMQ queue type of the lanes",
            )
        for fault_bench in (burst, drain):
            fault_bench.add_argument(
                "--fault",
                metavar="COMMAND",
                default=None,
                help="a shell command started 10 s before the burst instant with that instant in $T0 (epoch seconds), "
                "run beside the run: a node lost mid-burst, e.g. 'scripts/cluster/postgres.sh failover --at $T0' "
                "(docs/DEPLOYMENT.md)",
            )
        for process_bench in (burst, drain, fair, steady):
            process_bench.add_argument(
                "--horizon",
                type=float,
                default=None,
                help="the materializers' horizon in seconds (default: SCHEDULER_HORIZON_SECONDS, as deployed)",
            )
        noop = sub.add_parser(
            "celery-noop", help="a plain Celery worker running a noop task, one message per task: Celery's floor"
        )
        noop.add_argument("--tasks", type=int, required=True, help="task messages to publish and run")
        noop.add_argument("--concurrency", type=int, default=2, help="pool processes of the worker")
        peer = sub.add_parser(
            "peer-beat",
            help="the same burst under django-celery-beat's DatabaseScheduler (needs requirements-bench.txt)",
        )
        peer.add_argument("--tasks", type=int, required=True, help="periodic tasks due at the same minute boundary")
        peer.add_argument("--deadline", type=float, default=600.0, help="seconds after T0 before giving up")
        peer.add_argument("--lags-out", type=Path, default=None, help="write each message's lag (s), one per line")

    def handle(self, *args, **options) -> None:
        # SIGTERM (a supervisor, a CI timeout) stops the run as Ctrl-C does: the processes it started are stopped
        # on the way out rather than left running (they also die with it if it is SIGKILLed).
        signal.signal(signal.SIGTERM, _interrupt)
        try:
            self.run_bench(options)
        except KeyboardInterrupt:
            raise CommandError(
                "interrupted: the processes the run started were stopped; its rows are removed by the next run"
            ) from None

    def run_bench(self, options: dict[str, Any]) -> None:
        if options["bench"] == "celery-noop":
            self.handle_celery_noop(options)
        if options["bench"] == "burst":
            self.handle_burst(options)
        elif options["bench"] == "drain":
            self.handle_drain(options)
        elif options["bench"] == "fairness":
            self.handle_fairness(options)
        elif options["bench"] == "fleet":
            self.handle_fleet(options)
        elif options["bench"] == "steady":
            self.handle_steady(options)
        elif options["bench"] == "peer-beat":
            self.handle_peer_beat(options)

    def handle_burst(self, options: dict[str, Any]) -> None:
        check_process_options(options, "schedules", "tenants", "materializers", "relays")
        if options["idle"] < 0:
            raise CommandError("--idle must not be negative")
        config = BurstConfig(
            schedules=options["schedules"],
            tenants=options["tenants"],
            lane=options["lane"],
            materializers=options["materializers"],
            relays=options["relays"],
            idle=options["idle"],
            deadline_seconds=options["deadline"],
            keep=options["keep"],
            keep_idle=options["keep_idle"],
            lags_out=str(options["lags_out"]) if options["lags_out"] else None,
            queue_type=options["queue_type"],
            horizon_seconds=horizon_option(options),
            calendar_dates=options["calendar_dates"],
            fault=options["fault"],
        )
        if not 0 <= config.calendar_dates <= 5000:
            raise CommandError("--calendar-dates must be between 0 and 5000 (a calendar's most)")
        try:
            result = BurstBenchmark(config, out=self.stdout).run()
        except BenchRefused as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(result_line(result))

    def handle_drain(self, options: dict[str, Any]) -> None:
        check_process_options(options, "occurrences", "workers", "concurrency", "tenants", "materializers", "relays")
        if options["kill_one_of_each"] and min(options["materializers"], options["relays"], options["workers"]) < 2:
            raise CommandError("--kill-one-of-each needs at least 2 materializers, 2 relays and 2 workers")
        config = DrainConfig(
            schedules=options["occurrences"],
            tenants=options["tenants"],
            materializers=options["materializers"],
            relays=options["relays"],
            workers=options["workers"],
            concurrency=options["concurrency"],
            kill_one_of_each=options["kill_one_of_each"],
            deadline_seconds=options["deadline"],
            drain_deadline_seconds=options["deadline"],
            horizon_seconds=horizon_option(options),
            queue_type=options["queue_type"],
            fault=options["fault"],
        )
        bench = DrainBenchmark(config, out=self.stdout)
        bench.handler = options["handler"]
        try:
            result = bench.run()
        except BenchRefused as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(result_line(result))

    def handle_fleet(self, options: dict[str, Any]) -> None:
        if not 1 <= options["schedules"] <= 10_000:
            raise CommandError("--schedules must be from 1 to 10000 (one fleet call's limit)")
        bench = FleetBenchmark(FleetConfig(schedules=options["schedules"]), out=self.stdout)
        self.stdout.write(result_line(bench.run()))

    def handle_fairness(self, options: dict[str, Any]) -> None:
        for name in ("big", "small", "materializers", "relays"):
            if options[name] < 1:
                raise CommandError(f"--{name} must be at least 1")
        rate = options["big_fires_per_second"]
        if rate is not None and rate < 1:
            raise CommandError("--big-fires-per-second must be at least 1")
        if not options["deadline"] > 0:
            raise CommandError("--deadline must be a positive number of seconds after T0")
        config = FairnessConfig(
            schedules=options["big"] + options["small"],
            big=options["big"],
            small=options["small"],
            big_fires_per_second=rate,
            materializers=options["materializers"],
            relays=options["relays"],
            deadline_seconds=options["deadline"],
            horizon_seconds=horizon_option(options),
        )
        try:
            result = FairnessBenchmark(config, out=self.stdout).run()
        except BenchRefused as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(result_line(result))

    def handle_steady(self, options: dict[str, Any]) -> None:
        for name in ("rate", "tenants", "workers", "concurrency"):
            if options[name] < 1:
                raise CommandError(f"--{name} must be at least 1")
        if options["burst"] < 0:
            raise CommandError("--burst must not be negative")
        if not 0 < options["minutes"] <= 24 * 60:
            raise CommandError("--minutes must be more than 0 and at most a day (1440)")
        if not 1 <= options["period"] <= 3600:
            raise CommandError("--period must be between 1 and 3600 seconds")
        if options["tenants"] > 100_000:
            raise CommandError("--tenants is limited to 100,000")
        series_out: Path | None = options["series_out"]
        if series_out is not None and not series_out.resolve().parent.is_dir():
            raise CommandError(f"--series-out {series_out}: the directory {series_out.resolve().parent} does not exist")
        config = SteadyConfig(
            schedules=0,
            tenants=options["tenants"],
            workers=options["workers"],
            concurrency=options["concurrency"],
            rate=options["rate"],
            minutes=options["minutes"],
            burst=options["burst"],
            period_seconds=options["period"],
            series_out=str(series_out) if series_out else None,
            keep=options["keep"],
            horizon_seconds=horizon_option(options),
            queue_type=options["queue_type"],
        )
        try:
            result = SteadyBenchmark(config, out=self.stdout).run()
        except BenchRefused as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(result_line(result))

    def handle_celery_noop(self, options: dict[str, Any]) -> None:
        for name in ("tasks", "concurrency"):
            if options[name] < 1:
                raise CommandError(f"--{name} must be at least 1")
        config = CeleryNoopConfig(tasks=options["tasks"], concurrency=options["concurrency"])
        self.stdout.write(result_line(CeleryNoopBenchmark(config, out=self.stdout).run()))

    def handle_peer_beat(self, options: dict[str, Any]) -> None:
        config = peer_beat_config(options)
        if not beat_installed():
            raise CommandError(
                f"bench peer-beat needs django-celery-beat, which the product does not install: {INSTALL_HINT}"
            )
        try:
            if not beat_in_settings():
                returncode = run_under_bench_settings(config, out=self.stdout)
                if returncode:
                    raise CommandError(
                        f"bench peer-beat failed under scheduler_project.settings_bench (exit code {returncode}); "
                        "its message is above.",
                        returncode=returncode,
                    )
                return
            result = PeerBeatBenchmark(config, out=self.stdout).run()
        except PeerRefused as exc:
            raise CommandError(str(exc)) from None
        except KeyboardInterrupt:
            # The benchmark's own finally blocks have stopped beat and deleted its rows and queue by now.
            raise CommandError(
                "bench peer-beat interrupted: beat stopped, the bench's rows and queue removed", returncode=130
            ) from None
        self.stdout.write(result_line(result))


def horizon_option(options: dict[str, Any]) -> float | None:
    horizon = options["horizon"]
    if horizon is not None and not 1 <= horizon <= 3600:
        raise CommandError("--horizon must be between 1 and 3600 seconds")
    return horizon


def check_process_options(options: dict[str, Any], *names: str) -> None:
    """The counts a burst or a drain starts processes and tenants by: each at least 1, tenants at most 50."""
    for name in names:
        if options[name] < 1:
            raise CommandError(f"--{name} must be at least 1")
    if options["tenants"] > 50:
        raise CommandError("--tenants is limited to 50 (each bench tenant gets its own schema)")


def peer_beat_config(options: dict[str, Any]) -> PeerBeatConfig:
    """Validate `bench peer-beat` options into a config; every refusal names the option."""
    if options["tasks"] < 1:
        raise CommandError("--tasks must be at least 1")
    if not options["deadline"] > 0:
        raise CommandError("--deadline must be a positive number of seconds after T0")
    lags_out: Path | None = options["lags_out"]
    if lags_out is not None:
        if lags_out.is_dir():
            raise CommandError(f"--lags-out {lags_out} is a directory; give a file path")
        if not lags_out.resolve().parent.is_dir():
            raise CommandError(f"--lags-out {lags_out}: the directory {lags_out.resolve().parent} does not exist")
    return PeerBeatConfig(tasks=options["tasks"], deadline_seconds=options["deadline"], lags_out=lags_out)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
