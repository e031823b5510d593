"""A request that met a lost database connection is told 503 and when to retry; any other failure stays a 500
(scheduler_project/unavailable.py). The whole path, a web process through a PostgreSQL failover, is
tests/cluster/test_postgres_failover_burst.py."""

from __future__ import annotations

import json

import pytest
from django.db import InterfaceError, OperationalError
from django.test import RequestFactory

from scheduler_project.unavailable import RETRY_AFTER_SECONDS, api_server_error, console_server_error


def answer_while_handling(error: Exception, handler):
    request = RequestFactory().get("/api/v1/schedules/")
    try:
        raise error
    except Exception:
        return handler(request)


@pytest.mark.parametrize("error", [OperationalError("server closed the connection"), InterfaceError("closed")])
def test_a_lost_database_connection_is_a_503_with_retry_after(error):
    api = answer_while_handling(error, api_server_error)
    assert api.status_code == 503 and api["Retry-After"] == str(RETRY_AFTER_SECONDS)
    assert "Retry shortly" in json.loads(api.content)["detail"]
    console = answer_while_handling(error, console_server_error)
    assert console.status_code == 503 and console["Retry-After"] == str(RETRY_AFTER_SECONDS)


class ServerError(Exception):
    """What psycopg raises for an error the server reported: it carries the SQLSTATE."""

    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


def wrapped(sqlstate: str) -> OperationalError:
    """Django's OperationalError over a psycopg error, as Django raises it (the driver's error is the cause)."""
    error = OperationalError(sqlstate)
    error.__cause__ = ServerError(sqlstate)
    return error


@pytest.mark.parametrize("sqlstate", ["08006", "08001", "57P01", "57P03"])
def test_a_server_going_away_is_a_503(sqlstate):
    assert answer_while_handling(wrapped(sqlstate), api_server_error).status_code == 503


@pytest.mark.parametrize("sqlstate", ["40P01", "57014", "53100", "53300"])
def test_a_deadlock_a_timeout_a_full_disk_or_too_many_connections_stay_500s(sqlstate):
    """Not a failover: telling the client to retry in two seconds would hide a fault that stays."""
    assert answer_while_handling(wrapped(sqlstate), api_server_error).status_code == 500


def test_any_other_failure_stays_a_500_without_retry_after():
    api = answer_while_handling(ValueError("a bug"), api_server_error)
    assert api.status_code == 500 and json.loads(api.content) == {"detail": "Server error."}
    assert "Retry-After" not in api
    assert answer_while_handling(KeyError("x"), console_server_error).status_code == 500
