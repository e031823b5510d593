"""Every connection of the platform runs without JIT compilation: its statements are short, and their generic plans
priced above jit_above_cost made PostgreSQL compile for seconds what ran in milliseconds."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection

from dispatch.sql import database_conninfo

pytestmark = pytest.mark.django_db


def test_the_django_connection_runs_without_jit():
    with connection.cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone()[0] == "off"


def test_the_relays_own_connections_run_without_jit():
    with psycopg.connect(database_conninfo()) as conn:
        assert conn.execute("SHOW jit").fetchone()[0] == "off"
