"""`manage.py soak --iterations N [--points P,...] [--fires F]`: the crash-point matrix, repeated, as a table."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

from dispatch.bench.crash_matrix import CrashMatrix, table
from dispatch.bench.processes import result_line
from dispatch.engine.faults import POINTS


class Command(BaseCommand):
    help = (
        "Kill the real materializer, relay and worker at each named crash point, restart them, and check that no "
        "fire is lost and every effect happens once. Use a database of its own: it runs the platform's processes."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--iterations", type=int, default=10, help="deaths per crash point")
        parser.add_argument("--points", help=f"comma-separated crash points (default all: {', '.join(POINTS)})")
        parser.add_argument("--fires", type=int, default=10, help="one-off fires per iteration")
        parser.add_argument("--seed", type=int, help="random seed (which pass of a point kills)")

    def handle(self, *args, **options) -> None:
        if options["iterations"] < 1 or options["fires"] < 1:
            raise CommandError("--iterations and --fires must be at least 1")
        points = tuple(p.strip() for p in options["points"].split(",")) if options["points"] else POINTS
        unknown = [p for p in points if p not in POINTS]
        if unknown:
            raise CommandError(f"Unknown crash point(s) {', '.join(unknown)}; known: {', '.join(POINTS)}.")
        matrix = CrashMatrix(fires=options["fires"], seed=options["seed"])
        with tqdm(total=options["iterations"] * len(points), desc="soak", unit="run", file=self.stderr) as bar:
            results = matrix.run(points=points, iterations=options["iterations"], progress=bar.update)
        self.stdout.write(table(results))
        for result in results:
            for note in result.notes[:5]:
                self.stdout.write(f"  {result.point}: {note}")
        summary = {
            "iterations": options["iterations"],
            "points": len(points),
            "runs": sum(r.runs for r in results),
            "reached": sum(r.reached for r in results),
            "lost": sum(r.lost for r in results),
            "duplicate_effects": sum(r.duplicate_effects for r in results),
            "unclean_reconciles": sum(r.unclean_reconciles for r in results),
            "max_lag_s": round(max(r.max_lag_s for r in results), 3),
        }
        self.stdout.write(result_line(summary))
        if not all(r.clean for r in results):
            raise CommandError("the soak found lost fires, duplicate effects or unclean reconciles (see above)")
