"""Which locks each way of making or dropping a day partition takes while a long read holds the occurrence table.

The evidence behind docs/DESIGN.md "Upkeep": a scratch database gets the occurrence table of migration 0001 (parent,
DEFAULT, one day); one connection reads the whole table and stays in its transaction, as a long report or pg_dump
does; another runs the DDL; pg_locks shows what the DDL holds and waits for, and three statements of the data plane
(each with a 3 s lock_timeout) show what waits behind it.

    .venv/bin/python scripts/partition_locks.py [postgres://postgres@127.0.0.1:5432/postgres]

It creates and drops the database `partition_locks_probe` through the URL given (default the local server).
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
PROBE_DB = "partition_locks_probe"
INSERT = (
    "INSERT INTO dispatch_occurrence (occurrence_id, schedule_id, tenant_id, schedule_version, scheduled_for, "
    "available_at, lane) VALUES (gen_random_uuid(), gen_random_uuid(), 1, 1, '2030-01-01 12:00', now(), 'strict')"
)
UPDATE = (
    "UPDATE dispatch_occurrence SET state = 'enqueued' WHERE occurrence_id = gen_random_uuid() AND scheduled_for = "
)
LOCKS = """
SELECT c.relname, l.mode, l.granted FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation
WHERE l.pid = %s AND c.relname LIKE 'dispatch_occurrence%%' AND c.relkind IN ('r', 'p') ORDER BY l.granted, c.relname
"""
WAYS = {
    "CREATE TABLE ... PARTITION OF": [
        "CREATE TABLE dispatch_occurrence_p20300105 PARTITION OF dispatch_occurrence "
        "FOR VALUES FROM ('2030-01-05') TO ('2030-01-06')"
    ],
    "CREATE TABLE (LIKE ...) + ATTACH PARTITION": [
        "CREATE TABLE dispatch_occurrence_p20300106 "
        "(LIKE dispatch_occurrence INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
        "ALTER TABLE dispatch_occurrence ATTACH PARTITION dispatch_occurrence_p20300106 "
        "FOR VALUES FROM ('2030-01-06') TO ('2030-01-07')",
    ],
    "DROP TABLE <day partition>": ["DROP TABLE dispatch_occurrence_p20300105"],
    "DETACH PARTITION (then DROP)": [
        "ALTER TABLE dispatch_occurrence DETACH PARTITION dispatch_occurrence_p20300106",
        "DROP TABLE dispatch_occurrence_p20300106",
    ],
}


def meanwhile(url: str, label: str, *statements: str, generic: bool = False) -> str:
    """Run `statements` on a fresh connection with a 3 s lock timeout: how long they waited."""
    started = time.monotonic()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '3s'")
            if generic:  # the engine's prepared statements may run a generic plan, which locks every partition
                conn.execute("SET plan_cache_mode = force_generic_plan")
            for statement in statements:
                conn.execute(statement)
        outcome = "ok"
    except psycopg.errors.LockNotAvailable:
        outcome = "waited out its 3 s lock timeout"
    return f"    {label}: {outcome} ({time.monotonic() - started:.2f} s)"


def probe(url: str, name: str, ddl: list[str]) -> None:
    print(f"\n{name}")
    reader = psycopg.connect(url)
    reader.execute("SELECT count(*) FROM dispatch_occurrence").fetchone()  # ACCESS SHARE on parent + every partition
    worker = psycopg.connect(url, autocommit=True)
    done: list[str] = []

    def run() -> None:
        for statement in ddl:
            worker.execute(statement)
        done.append("done")

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(1.0)
    with psycopg.connect(url, autocommit=True) as observer:
        for relname, mode, granted in observer.execute(LOCKS, [worker.info.backend_pid]).fetchall():
            print(f"    the DDL {'holds' if granted else 'WAITS FOR'} {mode} on {relname}")
    print(meanwhile(url, "COPY-like INSERT into an existing day", INSERT))
    print(meanwhile(url, "UPDATE by key, pruned to one day", UPDATE + "'2030-01-01 12:00'"))
    print(
        meanwhile(
            url,
            "the same UPDATE as a generic prepared plan",
            "PREPARE q(timestamptz) AS " + UPDATE + "$1",
            "EXECUTE q('2030-01-01 12:00')",
            generic=True,
        )
    )
    reader.rollback()
    reader.close()
    thread.join()
    worker.close()


def main() -> None:
    admin_url = sys.argv[1] if len(sys.argv) > 1 else "postgres://postgres@127.0.0.1:5432/postgres"
    url = admin_url.rsplit("/", 1)[0] + f"/{PROBE_DB}"
    migration = (ROOT / "dispatch" / "migrations" / "0001_initial.py").read_text()
    tables = migration.split('PARTITIONED_TABLES_SQL = """')[1].split('"""')[0]
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {PROBE_DB}")
        admin.execute(f"CREATE DATABASE {PROBE_DB}")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(tables)
            conn.execute(
                "CREATE TABLE dispatch_occurrence_p20300101 PARTITION OF dispatch_occurrence "
                "FOR VALUES FROM ('2030-01-01') TO ('2030-01-02')"
            )
        for name, ddl in WAYS.items():
            probe(url, name, ddl)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {PROBE_DB}")


if __name__ == "__main__":
    main()
