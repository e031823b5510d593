"""A PostgreSQL primary with a synchronous standby: a commit is on the standby before it returns, and when the primary
is SIGKILLed and the standby promoted, connections made from the multi-host DATABASE_URL (Django's, and the relay's
own psycopg connection from database_conninfo) find the new primary by themselves and write there, and no commit
acknowledged before the loss is missing on it.

The failover test ends by making the old primary the new standby (postgres.sh rebuild-standby), so the topology is
whole again for the tests after it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from tests.cluster.conftest import ROOT, PostgresCluster, measured, wait_until

pytestmark = pytest.mark.cluster

FOLLOW_SECONDS = 30  # the bound: every process on the new primary within 30 s, without a restart
ROWS_BEFORE_KILL = 200

# A long-running process with the platform's settings and DATABASE_URL: every 0.2 s it writes one row through
# Django's connection and one through a psycopg connection made from dispatch.sql.database_conninfo() (the relay's
# and the settler's), reconnecting after an error as the product's loops do, and prints where each write landed.
PROBE = r"""
import json, sys, time
import django
django.setup()
import psycopg
from django.db import connection
from dispatch.sql import database_conninfo

WHERE = "SELECT inet_server_port(), pg_is_in_recovery()"
own = None
while True:
    line = {"at": time.time()}
    try:
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO failover_probe (writer) VALUES ('django')")
            cursor.execute(WHERE)
            line["django"] = cursor.fetchone()[0]
    except Exception as exc:
        line["django_error"] = type(exc).__name__
        connection.close()
    try:
        if own is None or own.closed or own.broken:
            own = psycopg.connect(database_conninfo(), autocommit=True)
        own.execute("INSERT INTO failover_probe (writer) VALUES ('relay')")
        line["relay"] = own.execute(WHERE).fetchone()[0]
    except Exception as exc:
        line["relay_error"] = type(exc).__name__
        if own is not None:
            own.close()
        own = None
    print(json.dumps(line), flush=True)
    time.sleep(0.2)
"""


def primary_connection(pg_cluster: PostgresCluster) -> psycopg.Connection:
    return psycopg.connect(pg_cluster.conninfo(), autocommit=True)


def test_a_commit_on_the_primary_is_on_the_standby(pg_cluster: PostgresCluster):
    primary = pg_cluster.primary()
    standby = 3 - primary
    with primary_connection(pg_cluster) as conn:
        assert conn.info.port == pg_cluster.port(primary), "target_session_attrs=read-write picked the primary"
        replicas = conn.execute("SELECT application_name, sync_state FROM pg_stat_replication").fetchall()
        assert replicas == [(f"pg{standby}", "quorum")], "the standby streams synchronously (ANY 1 of pg1, pg2)"
        conn.execute("CREATE TABLE IF NOT EXISTS sync_probe (id bigserial PRIMARY KEY, marker text)")
        marker = f"row-{time.time_ns()}"
        # remote_apply: the commit returns once the standby has applied it, so the row is visible there at once.
        # The deployment's `on` returns once the standby has flushed it: durable there, visible a moment later.
        conn.execute("SET synchronous_commit = remote_apply")
        conn.execute("INSERT INTO sync_probe (marker) VALUES (%s)", (marker,))
    with psycopg.connect(pg_cluster.node_conninfo(standby), autocommit=True) as replica:
        assert replica.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        assert replica.execute("SELECT count(*) FROM sync_probe WHERE marker = %s", (marker,)).fetchone() == (1,)


def test_after_the_primary_is_killed_and_the_standby_promoted_every_connection_writes_on_the_new_primary(
    pg_cluster: PostgresCluster, tmp_path: Path
):
    old = pg_cluster.primary()
    new = 3 - old
    with primary_connection(pg_cluster) as conn:
        conn.execute("DROP TABLE IF EXISTS failover_probe")
        conn.execute(
            "CREATE TABLE failover_probe (id bigserial PRIMARY KEY, writer text, at timestamptz DEFAULT now())"
        )
        # Acknowledged commits before the loss, each under synchronous_commit = on (the cluster's setting).
        for _ in range(ROWS_BEFORE_KILL):
            conn.execute("INSERT INTO failover_probe (writer) VALUES ('before')")

    output = (tmp_path / "probe.out").open("w+")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "scheduler_project.settings",
        "DATABASE_URL": pg_cluster.url("postgres"),
        "SCHEDULER_LOG_LEVEL": "WARNING",
    }
    probe = subprocess.Popen([sys.executable, "-c", PROBE], env=env, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
    try:

        def lines() -> list[dict]:
            output.flush()
            text = (tmp_path / "probe.out").read_text()
            return [json.loads(line) for line in text.splitlines() if line.startswith("{")]

        wait_until(
            lambda: any(line.get("django") == pg_cluster.port(old) and line.get("relay") for line in lines()),
            30,
            f"the probe to write on the primary pg{old}: {(tmp_path / 'probe.out').read_text()[-2000:]}",
        )
        killed_at = time.time()
        pg_cluster.kill_primary()
        promote_started = time.monotonic()
        pg_cluster.promote()
        promote_seconds = time.monotonic() - promote_started

        def on_new_primary(writer: str) -> float | None:
            at = [line["at"] for line in lines() if line["at"] > killed_at and line.get(writer) == pg_cluster.port(new)]
            return min(at) if at else None

        wait_until(
            lambda: on_new_primary("django") and on_new_primary("relay"),
            FOLLOW_SECONDS,
            f"both connections to write on pg{new}: {(tmp_path / 'probe.out').read_text()[-2000:]}",
        )
        assert probe.poll() is None, "the probe process was not restarted"
        django_after = on_new_primary("django") - killed_at  # type: ignore[operator]
        relay_after = on_new_primary("relay") - killed_at  # type: ignore[operator]
        with psycopg.connect(pg_cluster.conninfo(), autocommit=True) as conn:
            assert conn.info.port == pg_cluster.port(new)
            before = conn.execute("SELECT count(*) FROM failover_probe WHERE writer = 'before'").fetchone()
        measured(
            "postgresql primary SIGKILL + promote",
            promote_seconds=round(promote_seconds, 2),
            django_on_new_primary_after_kill_s=round(django_after, 2),
            relay_conninfo_on_new_primary_after_kill_s=round(relay_after, 2),
            acknowledged_before_kill=ROWS_BEFORE_KILL,
            found_on_new_primary=before[0] if before else None,
        )
        assert before == (ROWS_BEFORE_KILL,), "every commit acknowledged before the loss is on the new primary"
        assert django_after < FOLLOW_SECONDS and relay_after < FOLLOW_SECONDS
    finally:
        probe.terminate()
        probe.wait(timeout=10)
        output.close()
        rebuild_started = time.monotonic()
        pg_cluster.rebuild_standby()
        measured("postgresql rebuild-standby", seconds=round(time.monotonic() - rebuild_started, 1))

    with psycopg.connect(pg_cluster.conninfo(), autocommit=True) as conn:
        replicas = conn.execute("SELECT application_name, sync_state FROM pg_stat_replication").fetchall()
    assert replicas == [(f"pg{old}", "quorum")], "the old primary streams synchronously from the new one"
