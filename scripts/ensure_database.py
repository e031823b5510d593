"""Creates the database named in DATABASE_URL when it does not exist yet (migrate needs it to exist). A multi-host URL
(a primary and its standbys, docs/DEPLOYMENT.md) is read the way the platform reads it: the database is created on
the primary, whichever host that is now."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scheduler_project.database_url import libpq_parameters, parse_database_url

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/scheduler"


def main() -> int:
    config = parse_database_url(os.environ.get("DATABASE_URL", DEFAULT_URL))
    name = config["NAME"]
    options = config.get("OPTIONS") or {}
    params = {
        "host": config.get("HOST") or "127.0.0.1",
        "port": config.get("PORT") or 5432,
        "user": config.get("USER") or "postgres",
        "password": config.get("PASSWORD") or None,
        "dbname": "postgres",
        "autocommit": True,
        "connect_timeout": 10,
        **{key: value for key, value in options.items() if key in libpq_parameters()},
    }
    try:
        with psycopg.connect(**params) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if exists:
                print(f"Database {name}: exists")
            else:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
                print(f"Database {name}: created")
    except psycopg.Error as exc:
        print(f"error: cannot reach PostgreSQL to create database {name!r}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
