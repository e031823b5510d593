"""Databases of a test's own beside the test database (a benchmark's, a migration's), and the product's commands
run on them as an operator runs them: the deployment's settings, not the test settings."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

import psycopg
from django.conf import settings
from psycopg import sql

from tests.integration.processes import ROOT


def admin_connection(dbname: str = "postgres") -> psycopg.Connection:
    """An autocommit connection to `dbname` on the test database's server, as its user."""
    params = settings.DATABASES["default"]
    return psycopg.connect(
        host=params.get("HOST") or "127.0.0.1",
        port=params.get("PORT") or 5432,
        user=params.get("USER") or "postgres",
        dbname=dbname,
        autocommit=True,
    )


def database_url(name: str) -> str:
    params = settings.DATABASES["default"]
    return (
        f"postgres://{params.get('USER') or 'postgres'}@{params.get('HOST') or '127.0.0.1'}:"
        f"{params.get('PORT') or 5432}/{name}"
    )


def deployment_env(database: str) -> dict[str, str]:
    """The environment of a command on `database` with the deployment's settings."""
    env = {**os.environ, "DATABASE_URL": database_url(database), "SCHEDULER_LOG_LEVEL": "WARNING"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


def manage_on(database: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`manage.py <args>` on `database` to completion, output captured."""
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=deployment_env(database),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def drop_database(name: str) -> None:
    with admin_connection() as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _create(name: str, template: str | None = None) -> None:
    drop_database(name)
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    with admin_connection() as admin:
        for attempt in range(50):
            try:
                admin.execute(statement)
                return
            except psycopg.errors.ObjectInUse:  # the migrating process's backend is still on its way out
                if attempt == 49:
                    raise
                time.sleep(0.1)


def _migrate(name: str, *args: str) -> None:
    done = manage_on(name, "migrate", *args, "--noinput", "-v", "0")
    assert done.returncode == 0, f"manage.py migrate {' '.join(args)} on {name} failed:\n{done.stderr[-4000:]}"


@cache
def _migrated_template() -> str:
    """A database migrated all the way, once per test process, that fresh databases are copied from: a copy takes a
    second where migrating takes ten or more. Dropped when the process ends."""
    name = f"{settings.DATABASES['default']['NAME']}_migrated"
    _create(name)
    _migrate(name)
    atexit.register(drop_database, name)
    return name


def fresh_database(name: str, *migrate_to: str) -> None:
    """`name` created migrated all the way (a copy of a migrated database), then taken to `migrate_to` (an app and a
    migration) when given."""
    _create(name, template=_migrated_template())
    if migrate_to:
        _migrate(name, *migrate_to)


@contextmanager
def own_database(suffix: str, *migrate_to: str) -> Iterator[str]:
    """A fresh database named after the test database and `suffix` (see fresh_database), dropped afterwards."""
    name = f"{settings.DATABASES['default']['NAME']}_{suffix}"
    fresh_database(name, *migrate_to)
    try:
        yield name
    finally:
        drop_database(name)
