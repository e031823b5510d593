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


def test_any_other_failure_stays_a_500_without_retry_after():
    api = answer_while_handling(ValueError("a bug"), api_server_error)
    assert api.status_code == 500 and json.loads(api.content) == {"detail": "Server error."}
    assert "Retry-After" not in api
    assert answer_while_handling(KeyError("x"), console_server_error).status_code == 500
