"""Fixtures of the integration tests: the operator console, and reconcile about gaps only."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from dispatch import reconcile as reconcile_module
from tests.integration.webhook_target import target, webhook_occurrence  # noqa: F401 - fixtures of the webhook tests


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


@pytest.fixture
def gaps_only(monkeypatch):
    """Reconcile without the stuck check: histories materialized and never run by a worker would be all stuck, and
    the tests that use this are about gaps (stuck occurrences have tests of their own, test_stuck.py)."""
    monkeypatch.setattr(reconcile_module, "DEFAULT_STUCK_AFTER_SECONDS", 10**9)
