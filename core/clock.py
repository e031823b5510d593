"""PostgreSQL's clock: the one time source for decisions that several nodes must agree on."""

from __future__ import annotations

from datetime import datetime

from django.db import connection


def db_now() -> datetime:
    """The database server's current instant (clock_timestamp(), not the transaction start), aware UTC."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]
