"""Creates the database named in DATABASE_URL when it does not exist yet (migrate needs it to exist)."""

from __future__ import annotations

import os
import sys

import dj_database_url
import psycopg
from psycopg import sql

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/scheduler"


def main() -> int:
    config = dj_database_url.parse(os.environ.get("DATABASE_URL", DEFAULT_URL))
    name = config["NAME"]
    params = {
        "host": config.get("HOST") or "127.0.0.1",
        "port": config.get("PORT") or 5432,
        "user": config.get("USER") or "postgres",
        "password": config.get("PASSWORD") or None,
        "dbname": "postgres",
        "autocommit": True,
        "connect_timeout": 10,
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
