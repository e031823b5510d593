"""/healthz: whether the platform keeps its promise now, not only whether the web process runs.

200 `ok` only when PostgreSQL and RabbitMQ answer, a materializer and a relay wrote a heartbeat recently, no
active cursor is more than SCHEDULER_HEALTH_BEHIND_SECONDS in the past, no due envelope (other than one held back
by its tenant's own fire rate) has waited longer than that to be published, and no table that autovacuum does not
look after is ten times past its vacuum threshold. Otherwise 503: `unavailable` when the database or the broker is
down, `degraded` when they answer but fires would not go out on time (or soon would not), with the reasons.
A readiness and alerting signal for the platform; restarting the web process would mend none of these.

`autovacuum` says whether the server runs it; when it does not, `warnings` says so and the answer stays 200 as long
as the materializers' upkeep keeps the tables vacuumed (dispatch/upkeep.py). `warnings` also says when most of the
server's checkpoints were forced by WAL volume (max_wal_size too small for the load).

`assess()` is the one judgement: /healthz answers it as JSON, the operator console shows it as a banner in words
(dispatch/templatetags/console_health.py), so the two cannot disagree. Each problem carries both texts: /healthz's
reason (what monitors match on, unchanged) and the console's sentence (what it means for fires).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET
from kombu import Connection

from dispatch.metrics import live_heartbeat_seconds
from dispatch.sql import metrics as metrics_sql
from dispatch.upkeep import database_health

logger = logging.getLogger(__name__)

# Short: a health probe that hangs is worse than one that says "down".
BROKER_TIMEOUT_SECONDS = 2.0
# The console's pages other than the dashboard show an assessment at most this old (one per web process), so a page
# view costs no probe most of the time and the broker is asked at most this often per process.
CONSOLE_MAX_AGE_SECONDS = 10.0


@dataclass(frozen=True)
class Problem:
    """One reason the platform is not ok: `reason` in /healthz's words, `words` in the console banner's."""

    reason: str
    words: str


@dataclass(frozen=True)
class Engine:
    """What the health probe read (dispatch/sql/metrics.py HEALTH_PROBE); ages are None when no row says."""

    materializers: int
    relays: int
    behind: float
    materializer_age: float | None = None
    relay_age: float | None = None
    outbox_wait: float | None = None


@dataclass(frozen=True)
class Health:
    """The platform's state now: /healthz's status and fields, the problems behind a status other than ok, and the
    warnings that do not change it."""

    status: str
    fields: dict[str, object] = field(default_factory=dict)
    problems: tuple[Problem, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def body(self) -> dict[str, object]:
        """/healthz's JSON."""
        return {"status": self.status, **self.fields, "reasons": [problem.reason for problem in self.problems]}


def duration_words(seconds: float) -> str:
    """A span an operator reads at a glance: '45 s', '2 min', '3 h', '2 d' (whole units, rounded down)."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds // 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds // 3600:.0f} h"
    return f"{seconds // 86400:.0f} d"


def _silent(role: str, ttl: float, age: float | None, consequence: str) -> Problem:
    if age is None:
        words = f"No {role} is running (none has a heartbeat on record): {consequence}."
    else:
        words = f"No {role} has reported for {duration_words(age)}: {consequence}."
    return Problem(f"no {role} wrote a heartbeat in the last {ttl:.0f} s", words)


def engine_problems(engine: Engine, *, ttl: float, limit: float) -> tuple[dict[str, object], list[Problem]]:
    """/healthz's fields of the engine and the problems they show: silent processes, planning behind, fires due and
    not published. Pure: the probe's figures in, the judgement out."""
    fields: dict[str, object] = {
        "materializer": "ok" if engine.materializers else "silent",
        "relay": "ok" if engine.relays else "silent",
        "materialization": "behind" if engine.behind > limit else "ok",
    }
    problems = []
    if not engine.materializers:
        problems.append(_silent("materializer", ttl, engine.materializer_age, "fires are not being planned"))
    if not engine.relays:
        relay = _silent("relay", ttl, engine.relay_age, "fires due are not being published")
        problems.append(Problem(relay.reason, f"Relay down. {relay.words}"))
    if engine.behind > limit:
        problems.append(
            Problem(
                f"the earliest active cursor is {engine.behind:.0f} s behind now (limit {limit:.0f} s)",
                f"Planning is {duration_words(engine.behind)} behind (limit {limit:.0f} s): the earliest active "
                "schedule's next fire is that far in the past, so fires are planned late or recorded missed.",
            )
        )
    if engine.outbox_wait is not None and engine.outbox_wait > limit:
        problems.append(
            Problem(
                f"the oldest due envelope has waited {engine.outbox_wait:.0f} s to be published (limit {limit:.0f} s)",
                f"Outbox backlog: the oldest due envelope has waited {duration_words(engine.outbox_wait)} to be "
                f"published (limit {limit:.0f} s): fires go out late.",
            )
        )
    return fields, problems


def _engine() -> Engine | None:
    """The health probe's figures, or None: database down."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                metrics_sql.HEALTH_PROBE, {"ttl": live_heartbeat_seconds(), "shards": settings.SCHEDULER_SHARDS}
            )
            materializers, relays, behind, materializer_age, relay_age, outbox_wait = cursor.fetchone()
        return Engine(
            materializers,
            relays,
            float(behind or 0),
            None if materializer_age is None else float(materializer_age),
            None if relay_age is None else float(relay_age),
            None if outbox_wait is None else float(outbox_wait),
        )
    except Exception:
        logger.warning("health check: database unreachable", exc_info=True, extra={"action": "healthz"})
        return None


def _database() -> tuple[str, list[str], list[str]] | None:
    """database_health's (autovacuum, warnings, reasons), or None when the database does not answer."""
    try:
        with connection.cursor() as cursor:
            return database_health(cursor)
    except Exception:
        logger.warning("health check: database unreachable", exc_info=True, extra={"action": "healthz"})
        return None


def _broker_ok() -> bool:
    try:
        with Connection(settings.CELERY_BROKER_URL, connect_timeout=BROKER_TIMEOUT_SECONDS) as broker:
            broker.ensure_connection(max_retries=1, timeout=BROKER_TIMEOUT_SECONDS)
        return True
    except Exception:
        logger.warning("health check: broker unreachable", exc_info=True, extra={"action": "healthz"})
        return False


def assess() -> Health:
    """The platform's health now: the database, the broker, the engine's processes and backlog, the tables."""
    engine = _engine()
    broker = _broker_ok()
    fields: dict[str, object] = {"database": "ok" if engine else "down", "broker": "ok" if broker else "down"}
    problems = []
    if not engine:
        problems.append(
            Problem("PostgreSQL does not answer", "PostgreSQL does not answer: nothing is planned, sent or recorded.")
        )
    if not broker:
        problems.append(
            Problem("RabbitMQ does not answer", "RabbitMQ does not answer: no fire can be published or run.")
        )
    warnings: list[str] = []
    if engine:
        engine_fields, engine_found = engine_problems(
            engine, ttl=live_heartbeat_seconds(), limit=settings.SCHEDULER_HEALTH_BEHIND_SECONDS
        )
        fields.update(engine_fields)
        problems.extend(engine_found)
    database = _database() if engine else None
    if database:
        fields["autovacuum"], warnings, database_reasons = database
        fields["warnings"] = warnings
        problems.extend(Problem(reason, reason[:1].upper() + reason[1:] + ".") for reason in database_reasons)
    status = "ok" if not problems else ("unavailable" if not (engine and broker) else "degraded")
    health = Health(status, fields, tuple(problems), tuple(warnings))
    _remember(health)
    return health


_lock = threading.Lock()
_latest: tuple[float, Health] | None = None


def _remember(health: Health) -> None:
    global _latest
    with _lock:
        _latest = (time.monotonic(), health)


def recent_health(max_age: float = CONSOLE_MAX_AGE_SECONDS) -> Health:
    """The latest assessment of this process if it is at most `max_age` seconds old, else a new one: what every
    console page shows without paying for a probe (and a broker connection) on each view."""
    with _lock:
        latest = _latest
    if latest is not None and time.monotonic() - latest[0] <= max_age:
        return latest[1]
    return assess()


def forget() -> None:
    """Drop the remembered assessment (tests that change the platform between two page views)."""
    global _latest
    with _lock:
        _latest = None


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    health = assess()
    return JsonResponse(health.body(), status=200 if health.ok else 503)
