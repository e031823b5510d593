"""Fixtures of the integration tests that drive the operator console."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client


@pytest.fixture
def operator(db):
    """An operator of the console (a superuser)."""
    return get_user_model().objects.create_superuser("ops", "ops@example.com", "operator-password")


@pytest.fixture
def console(operator) -> Client:
    """The console, logged in as the operator, on the console's host."""
    client = Client(HTTP_HOST="localhost")
    client.force_login(operator)
    return client
