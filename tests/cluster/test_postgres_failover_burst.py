"""A 20,000-fire strict burst through the product's processes while the PostgreSQL primary is SIGKILLed and the
standby promoted at once (what an operator or a failover manager does). What must hold:

- nothing committed is lost (synchronous replication): every row and every success seen before the kill is on the
  new primary, and every one of the 20,000 fires succeeds there; a fire run twice ran under its own occurrence id;
- `manage.py reconcile` reports the window clean (exit code 0: no gap, nothing stuck);
- the materializer, the relay, the Celery worker and the web process each write on the new primary within 30 s of
  the kill, without being restarted (same processes, same pool processes);
- the enqueue lag recovers by itself: the fires due once the processes have followed are confirmed on time.

The burst is 20,000 one-off schedules due at one instant that the product's materializer turns into occurrences: one
is created through the services, the others are SQL copies of its rows (20,000 API calls would take minutes). From
before the kill to well after it, a client creates a one-off through the web process every half second: the first
answer after the kill times the web process, and those schedules' fires measure the lag before, during and after.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from django.db import connection, transaction
from django.db.models import Count

from core.clock import db_now
from core.shards import shard_for
from dispatch.models import Attempt, Occurrence, OccurrenceState
from schedules.models import Schedule
from tenants.models import Tenant
from tests import handlers as test_handlers
from tests.cluster.conftest import PostgresCluster, measured, wait_until
from tests.integration.fleet import Fleet, running_fleet

pytestmark = [pytest.mark.cluster, pytest.mark.django_db(transaction=True)]

FIRES = 20_000
LEAD_SECONDS = 12.0  # from choosing the release instant to the release: the copies and their materialization
KILL_AFTER_RELEASE_SECONDS = 0.5  # the relay publishing, the settler stamping, the worker running
FOLLOW_SECONDS = 30.0  # the bound: every process on the new primary within 30 s, without a restart
LAG_BOUND_SECONDS = 5.0  # docs/ARCHITECTURE.md: a strict fire is confirmed by the broker within 5 s of its instant
ALL_RUN_SECONDS = 240.0  # a guard, not a target: on a loaded two-core box the niced worker runs 20,000 slowly
PROBE_EVERY_SECONDS = 0.5
PROBE_FIRE_AFTER_SECONDS = 3.0  # each probe schedule fires this long after its creation
PROBE_UNTIL_AFTER_KILL_SECONDS = 45.0  # the last 15 s of probes fall due after FOLLOW_SECONDS
HEARTBEAT_POLL_SECONDS = 0.25  # well under SCHEDULER_HEARTBEAT_SECONDS: every heartbeat value is seen
UNLIMITED = 10**9


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def children(pid: int) -> set[int]:
    """The pids of a process's children (a Celery pool, a gunicorn worker): a restarted one has a new pid."""
    return {int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def spread(values: Iterable[float]) -> dict[str, float | None]:
    """Count, median, 99th percentile and maximum."""
    ordered = sorted(values)
    if not ordered:
        return {"n": 0, "p50": None, "p99": None, "max": None}

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))], 3)

    return {"n": len(ordered), "p50": at(0.5), "p99": at(0.99), "max": round(ordered[-1], 3)}


def iso(instant: datetime) -> str:
    return instant.astimezone(UTC).isoformat().replace("+00:00", "Z")


# --- the burst: one schedule through the services, the rest copies of its rows ------------------------------------


def _columns(cursor, table: str) -> list[str]:
    cursor.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = 'public' AND table_name = %s"
        " AND is_generated = 'NEVER' AND identity_generation IS NULL ORDER BY ordinal_position",
        [table],
    )
    return [row[0] for row in cursor.fetchall()]


def _copy_rows(cursor, table: str, key: str, template: uuid.UUID, replaced: dict[str, str]) -> None:
    """One row of `table` per burst_copy row: the template's, with `replaced` columns taken from the copy `c`."""
    columns = [column for column in _columns(cursor, table) if column != "id" or "id" in replaced]
    select = ", ".join(replaced.get(column, f"t.{column}") for column in columns)
    cursor.execute(
        f"INSERT INTO {table} ({', '.join(columns)}) SELECT {select} FROM {table} t CROSS JOIN burst_copy c"
        f" WHERE t.{key} = %s",
        [template],
    )


def copy_schedule(template: Schedule, count: int) -> list[uuid.UUID]:
    """`count` copies of `template` (schedule, cursor, version 1) under ids, names and shards of their own, as the
    services would have written them one by one; their ids."""
    ids = [uuid.uuid4() for _ in range(count)]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("CREATE TEMP TABLE burst_copy (id uuid PRIMARY KEY, name text, shard int) ON COMMIT DROP")
        with cursor.cursor.copy("COPY burst_copy (id, name, shard) FROM STDIN") as copy:
            for n, schedule_id in enumerate(ids):
                copy.write_row((schedule_id, f"{template.name}-{n}", shard_for(schedule_id)))
        _copy_rows(
            cursor, "schedules_schedule", "id", template.id, {"id": "c.id", "name": "c.name", "shard": "c.shard"}
        )
        _copy_rows(
            cursor, "schedules_schedulecursor", "schedule_id", template.id, {"schedule_id": "c.id", "shard": "c.shard"}
        )
        _copy_rows(
            cursor,
            "schedules_scheduleversion",
            "schedule_id",
            template.id,
            {"schedule_id": "c.id", "definition": "jsonb_set(t.definition, '{name}', to_jsonb(c.name))"},
        )
    return ids


# --- what runs beside the test: a web client and a heartbeat watch ------------------------------------------------


@dataclass
class Answer:
    sent: float
    answered: float
    status: int  # 0: no HTTP answer (refused, timed out)
    schedule_id: str | None


class WebClient(threading.Thread):
    """Creates a one-off through the web process every PROBE_EVERY_SECONDS, as a tenant would, until stopped."""

    def __init__(self, port: int, host: str, token: str) -> None:
        super().__init__(daemon=True)
        self.url = f"http://127.0.0.1:{port}/api/v1/schedules/"
        self.headers = {"Host": host, "Authorization": f"Token {token}", "Content-Type": "application/json"}
        self.answers: list[Answer] = []
        self.stop = threading.Event()

    def request(self, body: dict | None = None) -> tuple[int, dict]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url, data=data, headers=self.headers, method="POST" if data else "GET")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            return exc.code, {}
        except (urllib.error.URLError, OSError):
            return 0, {}

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            sent = time.time()
            run_at = datetime.fromtimestamp(sent + PROBE_FIRE_AFTER_SECONDS, UTC)
            body = {"name": f"probe-{n}", "kind": "once", "run_at": iso(run_at), "handler": "effect"}
            status, answer = self.request({**body, "max_lateness_seconds": 3600})
            self.answers.append(Answer(sent, time.time(), status, answer.get("id") if status == 201 else None))
            n += 1
            self.stop.wait(max(0.0, sent + PROBE_EVERY_SECONDS - time.time()))

    def created(self) -> list[str]:
        return [answer.schedule_id for answer in self.answers if answer.schedule_id]


@dataclass(eq=False)  # a thread is hashed by identity
class HeartbeatWatch(threading.Thread):
    """Polls the heartbeat table on whichever node is primary: the first heartbeat each process wrote after
    `after` (an epoch second), so on the new primary once `after` is the kill."""

    conninfo: str
    after: float = float("inf")
    first: dict[tuple[str, str], float] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        super().__init__(daemon=True)

    def run(self) -> None:
        conn: psycopg.Connection | None = None
        while not self.stop.is_set():
            try:
                conn = conn or psycopg.connect(self.conninfo, autocommit=True)
                rows = conn.execute(
                    "SELECT role, name, extract(epoch FROM heartbeat_at)::float8 FROM dispatch_processheartbeat"
                ).fetchall()
                for role, name, at in rows:
                    if at > self.after:
                        self.first.setdefault((role, name), at)
            except psycopg.Error:
                if conn is not None:
                    conn.close()
                conn = None
            self.stop.wait(HEARTBEAT_POLL_SECONDS)
        if conn is not None:
            conn.close()

    def first_of(self, role: str) -> dict[str, float]:
        return {name: at for (r, name), at in self.first.items() if r == role}


# --- the test ---------------------------------------------------------------------------------------------------


def occurrence_states(ids: list[uuid.UUID]) -> dict[str, int]:
    rows = Occurrence.objects.filter(schedule_id__in=ids).values_list("state").annotate(n=Count("pk")).order_by()
    return dict(rows)


def all_succeed(schedule_ids: list, seconds: float, what: str) -> None:
    """Wait until every fire of these schedules succeeded; a timeout names the states they are in."""
    try:
        wait_until(
            lambda: occurrence_states(schedule_ids) == {OccurrenceState.SUCCEEDED: len(schedule_ids)},
            seconds,
            what,
            every=1.0,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {occurrence_states(schedule_ids)}") from None


def test_a_strict_burst_loses_nothing_through_a_postgresql_failover_and_every_process_follows(
    pg_cluster: PostgresCluster, tenant_a, make_schedule
):
    tenant = tenant_a.tenant
    # The tenant's quotas out of the way: the test measures the failover, not a throttle.
    Tenant.objects.filter(pk=tenant.pk).update(
        max_schedules=UNLIMITED,
        max_fires_per_second=UNLIMITED,
        max_running=UNLIMITED,
        max_catchup_per_minute=UNLIMITED,
        max_retries_per_minute=UNLIMITED,
    )
    test_handlers.ensure_effects_table()
    assert synchronous_standbys(pg_cluster) == 1, f"a primary with a synchronous standby: {pg_cluster.status()}"
    dbname = connection.settings_dict["NAME"]
    watch = HeartbeatWatch(pg_cluster.conninfo(dbname))
    port = free_port()
    client = WebClient(port, tenant_a.domain, tenant_a.token)
    try:
        with running_fleet(f"pgburst-{uuid.uuid4().hex[:6]}") as fleet:
            burst_through_a_failover(pg_cluster, fleet, tenant, make_schedule, client, watch, port)
    finally:
        client.stop.set()
        watch.stop.set()
        # The tests after this one find a primary with a synchronous standby, whatever failed here.
        if synchronous_standbys(pg_cluster) != 1:
            started = time.monotonic()
            pg_cluster.rebuild_standby()
            measured("postgresql rebuild-standby after the burst", seconds=round(time.monotonic() - started, 1))


def burst_through_a_failover(
    pg_cluster: PostgresCluster,
    fleet: Fleet,
    tenant: Tenant,
    make_schedule: Callable[..., Schedule],
    client: WebClient,
    watch: HeartbeatWatch,
    port: int,
) -> None:
    """The test's body, with its processes running."""
    fleet.materializer()
    fleet.relay()
    worker = fleet.worker(concurrency=2)
    web = fleet.web(port)
    fleet.wait_consuming()
    wait_until(lambda: client.request()[0] == 200, 60, "the web process to answer")
    wait_until(
        lambda: {"materializer", "relay"} <= heartbeat_roles(),
        60,
        "the materializer and the relay to write their heartbeats",
    )
    old = pg_cluster.primary()

    release = db_now() + timedelta(seconds=LEAD_SECONDS)
    # One transaction: the materializer must not move the template's cursor before it is copied.
    with transaction.atomic():
        template = make_schedule(
            tenant, name="burst", kind="once", run_at=release, handler="effect", max_lateness_seconds=3600
        )
        burst = [template.id, *copy_schedule(template, FIRES - 1)]
    client.start()
    watch.start()

    def materialized() -> int:
        return Occurrence.objects.filter(scheduled_for=release, tenant_id=tenant.id).count()

    wait_until(lambda: materialized() == FIRES or db_now() >= release, LEAD_SECONDS + 10, "the burst's rows")
    materialized_before_release = (release - db_now()).total_seconds()
    time.sleep(max(0.0, (release - db_now()).total_seconds() + KILL_AFTER_RELEASE_SECONDS))

    # What is committed just before the kill: every row must be on the new primary, every success stay one.
    before = dict(Occurrence.objects.filter(tenant_id=tenant.id).values_list("occurrence_id", "state"))
    effects_before = test_handlers.effects()
    workers_before, web_before = children(worker.pid), children(web.pid)
    pg_cluster.kill_primary()
    killed_at = watch.after = time.time()
    promote_started = time.monotonic()
    pg_cluster.promote()
    promote_seconds = time.monotonic() - promote_started
    connection.close()  # the test's own connection was to the old primary
    new = pg_cluster.primary()
    assert new != old

    all_succeed(burst, ALL_RUN_SECONDS, "every fire of the burst to succeed")
    all_succeeded_after_kill = time.time() - killed_at
    time.sleep(max(0.0, killed_at + PROBE_UNTIL_AFTER_KILL_SECONDS - time.time()))
    client.stop.set()
    client.join(timeout=15)
    probes = client.created()
    all_succeed(probes, 60, "every probe fire to succeed")

    # A fire claimed before its envelope's confirmation was settled gets its enqueued_at from the settler after.
    wait_until(
        lambda: not Occurrence.objects.filter(schedule_id__in=[*burst, *probes], enqueued_at__isnull=True).exists(),
        30,
        "every confirmation to be settled onto its occurrence (enqueued_at)",
    )

    # --- measurements ---
    first_write = {
        role: {name: round(at - killed_at, 2) for name, at in watch.first_of(role).items()}
        for role in ("materializer", "relay", "worker")
    }
    web_after_kill = [a for a in client.answers if a.sent > killed_at]
    web_first_2xx = next((a.answered - killed_at for a in web_after_kill if 200 <= a.status < 300), None)
    web_failed = [a.status for a in web_after_kill if not 200 <= a.status < 300]
    first_write["web"] = {"first 2xx write": round(web_first_2xx, 2) if web_first_2xx is not None else None}

    rows = Occurrence.objects.filter(schedule_id__in=burst)
    burst_lags = [(at - release).total_seconds() for at in rows.values_list("enqueued_at", flat=True)]
    probe_rows = list(
        Occurrence.objects.filter(schedule_id__in=probes).values_list("scheduled_for", "enqueued_at", "state")
    )
    recovered_from = killed_at + FOLLOW_SECONDS

    def probe_lags(since: float, until: float) -> list[float]:
        return [(enqueued - due).total_seconds() for due, enqueued, _ in probe_rows if since <= due.timestamp() < until]

    attempts = dict(
        Attempt.objects.filter(occurrence_id__in=rows.values("occurrence_id"))
        .values_list("occurrence_id")
        .annotate(n=Count("pk"))
        .order_by()
    )
    effects = test_handlers.effects()
    burst_ids = set(rows.values_list("occurrence_id", flat=True))
    all_ids = set(Occurrence.objects.filter(tenant_id=tenant.id).values_list("occurrence_id", flat=True))
    succeeded_before = {oid for oid, state in before.items() if state == OccurrenceState.SUCCEEDED}
    finished = [at.timestamp() - killed_at for at in rows.values_list("finished_at", flat=True)]
    per_10s = [sum(1 for s in finished if 10 * n <= s < 10 * (n + 1)) for n in range(int(max(finished) // 10) + 1)]
    measured(
        "20,000-fire strict burst through a PostgreSQL failover (primary SIGKILLed, standby promoted)",
        fires=FIRES,
        materialized_before_release_s=round(materialized_before_release, 2),
        kill_after_release_s=round(killed_at - release.timestamp(), 2),
        promote_s=round(promote_seconds, 2),
        rows_before_kill=len(before),
        succeeded_before_kill=len(succeeded_before),
        all_succeeded_after_kill_s=round(all_succeeded_after_kill, 1),
        burst_succeeded_per_10s_after_kill=per_10s,
        occurrences_run_more_than_once=sum(1 for n in effects.values() if n > 1),
        attempts_more_than_one=sum(1 for n in attempts.values() if n > 1),
        first_write_on_new_primary_after_kill_s=first_write,
        web_answers_after_kill_not_2xx=web_failed,
        burst_enqueue_lag_s=spread(burst_lags),
        probe_enqueue_lag_before_kill_s=spread(probe_lags(0, killed_at)),
        probe_enqueue_lag_first_30s_after_kill_s=spread(probe_lags(killed_at, recovered_from)),
        probe_enqueue_lag_after_30s_s=spread(probe_lags(recovered_from, float("inf"))),
    )

    # --- nothing lost ---
    assert len(burst_ids) == FIRES, "one occurrence per fire: none lost, none made up under another id"
    assert occurrence_states(burst) == {OccurrenceState.SUCCEEDED: FIRES}
    assert set(before) <= all_ids, "every occurrence committed before the kill is on the new primary"
    assert all(effects.get(oid, 0) >= n for oid, n in effects_before.items()), "every effect before the kill survived"
    assert all(effects.get(oid) == effects_before.get(oid) for oid in succeeded_before), (
        "a fire that had succeeded before the kill did not run again (its success survived the failover)"
    )
    assert burst_ids <= set(effects), "every fire's effect happened"
    assert set(effects) <= all_ids, "every run, the repeated ones too, ran under a fire's own occurrence id"

    # --- every process followed, without a restart ---
    # A request that met the dead connection is told to retry (503), never a server error (0: no answer at all).
    assert set(web_failed) <= {0, 503}, f"the web process answered {web_failed} during the failover"
    for role, firsts in first_write.items():
        assert firsts and all(s is not None and s < FOLLOW_SECONDS for s in firsts.values()), (
            f"the {role} wrote on the new primary within {FOLLOW_SECONDS:.0f} s of the kill: {firsts}"
        )
    assert {int(name.rsplit("/", 1)[1]) for name in first_write["worker"]} <= workers_before, (
        "the worker's heartbeats on the new primary come from the pool processes it had before the kill"
    )
    for process, _ in fleet.processes:
        assert process.poll() is None, f"{process.args} is still running (it was not restarted)"
    assert children(worker.pid) == workers_before and children(web.pid) == web_before, "no pool process restarted"

    # --- the lag recovered by itself ---
    after = probe_lags(recovered_from, float("inf"))
    assert after and max(after) <= LAG_BOUND_SECONDS, f"fires due after the processes followed are on time: {after}"

    # --- reconcile: every fire owed in the window has its row, nothing is stuck ---
    # Every fire has run, so the window is checked to its end (--grace 0): nothing is still being materialized.
    since, until = release - timedelta(seconds=60), db_now()
    window = ("--since", iso(since), "--until", iso(until), "--tenant", tenant.slug, "--grace", "0")
    window += ("--stuck-after", "0", "--json")  # every fire has run: one not done by now is stuck
    done = fleet.manage("reconcile", *window)
    report = json.loads(done.stdout or "{}")
    measured(
        "reconcile after the failover",
        exit_code=done.returncode,
        **{key: report.get(key) for key in ("checked_until", "expected", "found", "missing", "stuck", "ok")},
    )
    assert done.returncode == 0, f"reconcile is clean: {done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    assert report["ok"] and report["missing"] == 0 and report["stuck"] == 0
    assert report["expected"] >= FIRES, "the window reconciled holds the burst"


def synchronous_standbys(pg_cluster: PostgresCluster) -> int:
    """How many standbys the primary waits for now (0 after a promotion, or when there is no primary)."""
    try:
        with psycopg.connect(pg_cluster.conninfo(), autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')")
            return row.fetchone()[0]  # type: ignore[index]
    except psycopg.Error:
        return 0


def heartbeat_roles() -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT role FROM dispatch_processheartbeat")
        return {row[0] for row in cursor.fetchall()}
