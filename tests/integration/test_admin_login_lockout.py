"""The operator console's login (django-axes): a username that fails too often from one address is locked out there,
right password or not, for the cool-off period, with a page that says so."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from axes.models import AccessAttempt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.utils import timezone

LOGIN = "/admin/login/"
PASSWORD = "operator-password"


@pytest.fixture
def operator(db):
    return get_user_model().objects.create_superuser("ops", "ops@example.com", PASSWORD)


def log_in(client: Client, password: str, *, username: str = "ops", address: str = "192.0.2.10"):
    return client.post(
        f"{LOGIN}?next=/admin/", {"username": username, "password": password, "next": "/admin/"}, REMOTE_ADDR=address
    )


def logged_in(client: Client) -> bool:
    return client.get("/admin/").status_code == 200


def fail(client: Client, times: int, **who: str) -> list[int]:
    return [log_in(client, "wrong-password", **who).status_code for _ in range(times)]


def test_the_defaults_are_five_failures_and_fifteen_minutes():
    assert settings.AXES_FAILURE_LIMIT == 5
    assert timedelta(minutes=15) == settings.AXES_COOLOFF_TIME
    assert settings.AXES_LOCKOUT_PARAMETERS == [["username", "ip_address"]]
    assert settings.AUTHENTICATION_BACKENDS[0] == "axes.backends.AxesStandaloneBackend"


def test_after_five_bad_passwords_even_the_right_one_is_refused_with_a_lockout_page(operator):
    client = Client(HTTP_HOST="localhost")

    assert fail(client, 4) == [200] * 4
    fifth = log_in(client, "wrong-password")
    sixth = log_in(client, PASSWORD)

    assert fifth.status_code == 429
    assert sixth.status_code == 429
    page = sixth.content.decode()
    assert "Account locked: too many failed login attempts" in page
    assert "Scheduler operator console" in page
    assert sixth.headers["Retry-After"] == "900"
    assert not logged_in(client)


def test_a_failed_login_below_the_limit_shows_the_usual_form_error(operator):
    response = log_in(Client(HTTP_HOST="localhost"), "wrong-password")

    assert response.status_code == 200
    assert "Please enter the correct username and password" in response.content.decode()


def test_the_lockout_holds_one_username_at_one_address_only(operator):
    get_user_model().objects.create_superuser("ops2", "ops2@example.com", PASSWORD)
    client = Client(HTTP_HOST="localhost")
    fail(client, 5)

    assert log_in(client, PASSWORD).status_code == 429
    # A guesser cannot lock the operator out everywhere, nor lock out everyone at one address.
    elsewhere = Client(HTTP_HOST="localhost")
    assert log_in(elsewhere, PASSWORD, address="198.51.100.20").status_code == 302
    colleague = Client(HTTP_HOST="localhost")
    assert log_in(colleague, PASSWORD, username="ops2").status_code == 302


def test_a_successful_login_forgets_the_earlier_failures(operator):
    client = Client(HTTP_HOST="localhost")
    fail(client, 4)
    assert log_in(client, PASSWORD).status_code == 302
    client.logout()

    assert fail(client, 4) == [200] * 4
    assert log_in(client, PASSWORD).status_code == 302
    assert logged_in(client)


def test_the_lockout_ends_after_the_cool_off(operator):
    client = Client(HTTP_HOST="localhost")
    fail(client, 5)
    assert log_in(client, PASSWORD).status_code == 429

    with time_machine.travel(timezone.now() + timedelta(minutes=16)):
        assert log_in(client, PASSWORD).status_code == 302
    assert not AccessAttempt.objects.filter(username="ops").exists()


def test_attempts_are_recorded_in_the_public_schema_only(operator, tenants):
    fail(Client(HTTP_HOST="localhost"), 2)

    attempt = AccessAttempt.objects.get(username="ops")
    assert (attempt.failures_since_start, attempt.ip_address) == (2, "192.0.2.10")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT table_schema FROM information_schema.tables WHERE table_name = %s",
            [AccessAttempt._meta.db_table],
        )
        assert [row[0] for row in cursor.fetchall()] == ["public"]
