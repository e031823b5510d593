"""PostgreSQL's clock: the one time source for decisions that several nodes must agree on."""

from __future__ import annotations

from datetime import datetime

from django.db import connection

# PostgreSQL's clock, not the transaction's start: the one every node agrees on (docs/ARCHITECTURE.md rule 1).
DB_NOW = "SELECT clock_timestamp()"


def db_now() -> datetime:
    """The database server's current instant (clock_timestamp(), not the transaction start), aware UTC."""
    with connection.cursor() as cursor:
        cursor.execute(DB_NOW)
        return cursor.fetchone()[0]
