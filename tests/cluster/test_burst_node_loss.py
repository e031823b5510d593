"""A 20,000-fire strict burst through every process of the platform on the clusters, while a RabbitMQ node is lost
at the burst instant: what `bench drain --fault` and `bench burst --fault` measure (docs/BENCHMARKS.md,
docs/DEPLOYMENT.md), held to the guarantees.

- the node leading the strict queue is SIGKILLed: every fire runs, none runs twice, reconcile is clean, the
  confirmation lag's p99 stays within 5 s, and the node rejoins and the queue is replicated on all three again;
- the node leading the strict queue is frozen (SIGSTOP), as a partitioned node is: nothing confirmed is missing from
  the queue the majority kept, and nothing is lost.

The PostgreSQL primary's loss under the same burst is test_postgres_failover_burst.py.

The benchmark runs as an operator would run it, in a database of its own on the cluster (it needs a quiet one), with
the multi-host DATABASE_URL and the broker failover list, so its materializer, relay and workers follow the live
nodes by themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from tests.cluster.conftest import RABBIT_NODES, ROOT, PostgresCluster, RabbitCluster, measured, wait_until

pytestmark = pytest.mark.cluster

FIRES = 20_000
P99_BOUND_SECONDS = 5.0  # the seed's bound on a strict fire's enqueue, p99
BENCH_SECONDS = 900
# Longer than the relay's publish timeout (10 s), so the relay gives up on the frozen node and moves.
PAUSE_SECONDS = 20


@pytest.fixture(scope="module")
def bench_database(pg_cluster: PostgresCluster) -> Iterator[str]:
    """A migrated database of its own on the cluster, as a multi-host DATABASE_URL; dropped afterwards."""
    name = f"cluster_bench_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(pg_cluster.conninfo(), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    url = pg_cluster.url(name)
    manage("migrate", "-v0", database_url=url, timeout=300)
    try:
        yield url
    finally:
        with psycopg.connect(pg_cluster.conninfo(), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def manage(*args: str, database_url: str, broker_url: str = "", timeout: float) -> str:
    env = {**os.environ, "DATABASE_URL": database_url}
    if broker_url:
        env["CELERY_BROKER_URL"] = broker_url
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"manage.py {' '.join(args)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def bench(kind: str, database_url: str, broker_url: str, fault: str, *options: str) -> dict:
    """`bench burst` or `bench drain` of FIRES strict fires on quorum lanes, `fault` striking at T0; its result."""
    output = manage(
        "bench",
        kind,
        f"--{'schedules' if kind == 'burst' else 'occurrences'}={FIRES}",
        "--queue-type=quorum",
        "--horizon=30",
        "--deadline=300",
        f"--fault={fault}",
        *options,
        database_url=database_url,
        broker_url=broker_url,
        timeout=BENCH_SECONDS,
    )
    return json.loads(output.strip().splitlines()[-1])


def bench_drain(database_url: str, broker_url: str, fault: str) -> dict:
    """Through two workers of two pool processes each, to the handler's effect."""
    return bench("drain", database_url, broker_url, fault, "--workers=2", "--concurrency=2")


def strict_queue(database_url: str) -> str:
    """The bench's strict queue on this database (dispatch/bench/rows.py names it after the database)."""
    return f"bench.{database_url.rsplit('/', 1)[1].split('?')[0]}.strict"


def assert_the_burst_survived(result: dict, *, p99_bound: float | None) -> None:
    assert result["fault"]["exit"] == 0, result["fault"]
    assert result["lost"] == 0, result
    assert result["executed"] == FIRES, result
    # At least once: a fire redelivered after the loss runs again under its own occurrence_id, and its effect
    # (keyed by that id) is still one.
    assert result["effects"] == FIRES and result["duplicate_effects"] == 0, result
    assert result["duplicates"] == 0, result  # no fire got two occurrence rows
    assert result["reconcile"]["ok"] and result["reconcile"]["expected"] == FIRES, result["reconcile"]
    if p99_bound is not None:
        assert result["lag_p99_s"] <= p99_bound, result


def summary(result: dict) -> dict:
    keys = ("lag_p50_s", "lag_p99_s", "lag_max_s", "executed", "executed_per_s", "attempts", "reruns", "lost")
    return {key: result.get(key) for key in keys} | {"fault_output": result["fault"]["output"]}


def test_a_burst_survives_losing_the_strict_queues_leader(rabbit_cluster: RabbitCluster, bench_database: str) -> None:
    rabbit_cluster.assert_whole()
    queue = strict_queue(bench_database)
    fault = f"bash scripts/cluster/rabbitmq.sh kill-leader {queue} --at $T0"
    try:
        result = bench_drain(bench_database, rabbit_cluster.urls, fault)
        measured("bench drain, strict-queue leader SIGKILLed at T0", fires=FIRES, **summary(result))
        assert_the_burst_survived(result, p99_bound=P99_BOUND_SECONDS)
    finally:
        killed = [node for node in RABBIT_NODES if not rabbit_cluster.alive(node)]
        for node in killed:
            rabbit_cluster.rejoin(node)
    assert len(killed) == 1, f"the fault should have killed one node, not {killed}"
    rabbit_cluster.assert_whole()
    # The queue the leader was lost under is replicated on all three again (the bench deletes its queues at the
    # end, so a queue of the same kind is declared here and its members read).
    everyone = sorted(rabbit_cluster.name(node) for node in RABBIT_NODES)
    probe = f"cluster-replicated-{uuid.uuid4().hex[:6]}"
    rabbit_cluster.declare_quorum(probe)
    try:
        wait_until(lambda: sorted(rabbit_cluster.queue(1, probe)["online"]) == everyone, 60, "3 online members")
    finally:
        rabbit_cluster.ctl(1, "delete_queue", probe)


def test_a_partitioned_leader_confirms_nothing_the_majority_does_not_hold(
    rabbit_cluster: RabbitCluster, bench_database: str
) -> None:
    """The node leading the strict queue is frozen (SIGSTOP: alive, its connections open, silent) at T0 for longer
    than the relay's publish timeout, then resumed: the relay leaves it for a live node, and no workers run, so the
    broker's read-back of the queues after the heal is the record. Every fire stamped confirmed is on the queue the
    majority kept (lost_on_broker 0), and no fire is missing (lost 0)."""
    rabbit_cluster.assert_whole()
    queue = strict_queue(bench_database)
    fault = f"bash scripts/cluster/rabbitmq.sh pause-leader {queue} --at $T0 --for {PAUSE_SECONDS}"
    try:
        result = bench("burst", bench_database, rabbit_cluster.urls, fault)
        measured(
            "bench burst, strict-queue leader paused (SIGSTOP) at T0",
            paused_s=PAUSE_SECONDS,
            **{key: result.get(key) for key in ("lag_p50_s", "lag_p99_s", "lag_max_s", "lost", "lost_on_broker")},
            broker_messages=result["broker_messages"],
            fault_output=result["fault"]["output"],
        )
        assert result["fault"]["exit"] == 0, result["fault"]
        assert result["lost"] == 0 and result["enqueued"] == FIRES, result
        assert result["lost_on_broker"] == 0, result
    finally:
        for node in RABBIT_NODES:
            rabbit_cluster.resume(node)
    wait_until(rabbit_cluster.is_whole, 120, "the paused node to be back in the cluster")
