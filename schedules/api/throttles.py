"""API request rates: a budget per token, a ceiling per tenant over its tokens, and a budget per client address for
everything without a valid token, which never touches a tenant's or a token's budget.

Each budget is a window of its rate's length that starts with the first request after the last window ended, and
its count lives in PostgreSQL (api_rate_counter, schedules/migrations/0016), counted by one statement per request:
every gunicorn worker sees the same counts, and parallel requests cannot both pass the last place (DRF's own
counters in the cache were a read, then a write of the whole request history: 150 parallel requests let 94 through
a budget of 50, and each request spent 8 queries on the cache table).
"""

from __future__ import annotations

import math
import random
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from rest_framework.request import Request
from rest_framework.settings import api_settings
from rest_framework.throttling import BaseThrottle, SimpleRateThrottle

from scheduler_project.client_address import address_bucket, client_address

# Count this request in budget `key`: a new window (count 1) if the last one has ended, else one more in it. The
# window's start and the count change in one row update, under the row's lock, so the count is exact.
COUNT_REQUEST = """
INSERT INTO api_rate_counter AS counter (key, window_start, count)
VALUES (%(key)s, clock_timestamp(), 1)
ON CONFLICT (key) DO UPDATE SET
    count = CASE WHEN counter.window_start + %(window)s * interval '1 second' > EXCLUDED.window_start
                 THEN counter.count + 1 ELSE 1 END,
    window_start = CASE WHEN counter.window_start + %(window)s * interval '1 second' > EXCLUDED.window_start
                        THEN counter.window_start ELSE EXCLUDED.window_start END
RETURNING count, EXTRACT(EPOCH FROM window_start + %(window)s * interval '1 second' - clock_timestamp())
"""
# Budgets idle for a day (the longest window a rate can name) are forgotten; once every so many requests.
FORGET_IDLE = "DELETE FROM api_rate_counter WHERE window_start < clock_timestamp() - interval '1 day'"
FORGET_EVERY = 1000


def _authenticated(request: Request) -> bool:
    user = request.user
    return bool(user is not None and user.is_authenticated)


class _RateBudget(SimpleRateThrottle):
    """A budget of `num_requests` per `duration` seconds for the key get_cache_key names (None: not counted here).
    The rate is read per request, not bound at import (so override_settings reaches it), and a refusal always
    carries a whole number of seconds to wait."""

    def __init__(self) -> None:
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        self.seconds_left: float = 0.0

    def get_rate(self) -> str | None:
        rates = api_settings.DEFAULT_THROTTLE_RATES
        if self.scope not in rates:
            raise ImproperlyConfigured(f"REST_FRAMEWORK has no DEFAULT_THROTTLE_RATES entry {self.scope!r}.")
        rate = rates[self.scope]
        return None if rate is None else str(rate)

    def key_for(self, ident: str) -> str:
        return f"{self.scope}:{ident}"

    def allow_request(self, request: Request, view: Any) -> bool:
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        with connection.cursor() as cursor:
            cursor.execute(COUNT_REQUEST, {"key": key, "window": self.duration})
            count, seconds_left = cursor.fetchone()
            if random.randrange(FORGET_EVERY) == 0:
                cursor.execute(FORGET_IDLE)
        self.seconds_left = float(seconds_left)
        return count <= self.num_requests

    def wait(self) -> float:
        # docs/API.md ("Errors") promises a Retry-After with every 429: at least a second.
        return max(1, math.ceil(self.seconds_left))


class TokenRateThrottle(_RateBudget):
    """Each API token has its own budget (SCHEDULER_API_RATE)."""

    scope = "token"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if not _authenticated(request):
            return None
        # Token ids are per tenant schema: the schema makes the budget's name unique.
        return self.key_for(f"{request.tenant.schema_name}-{request.user.pk}")


class TenantRateThrottle(_RateBudget):
    """All tokens of one tenant together (SCHEDULER_API_TENANT_RATE): one tenant cannot take the control plane
    from the others. Only authenticated requests count, so nobody without a token can spend it."""

    scope = "tenant"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        tenant = getattr(request, "tenant", None)
        if not _authenticated(request) or tenant is None or tenant.schema_name == "public":
            return None
        return self.key_for(tenant.schema_name)


class AddressRateThrottle(_RateBudget):
    """Requests without a valid token (the schema, the docs, a missing or bad token) per client address
    (SCHEDULER_API_ANON_RATE), across all tenant hosts: an anonymous flood spends only its own budget."""

    scope = "anon"

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if _authenticated(request):
            return None
        return self.key_for(address_bucket(client_address(request)))


class ApiClientThrottle(BaseThrottle):
    """An authenticated request spends its token's budget first and only then its tenant's.

    DRF's own loop asks every throttle class and counts the request in each that admits it, so a token over its
    budget would keep spending the tenant's ceiling with requests it was refused, and so use up the share of the
    tenant's other tokens. Asked in this order, a refused request spends nothing further.
    """

    def __init__(self) -> None:
        self.refused_by: _RateBudget | None = None

    def allow_request(self, request: Request, view: Any) -> bool:
        for budget in (TokenRateThrottle(), TenantRateThrottle()):
            if not budget.allow_request(request, view):
                self.refused_by = budget
                return False
        return True

    def wait(self) -> float | None:
        return self.refused_by.wait() if self.refused_by is not None else None


def unauthenticated_wait(request: Request, view: Any) -> float | None:
    """Counts a request refused with a 401 in its address's budget; the seconds to wait once that is spent.

    DRF authenticates before it throttles, so a missing or bad token never reaches the throttle classes: the
    exception handler calls this for those requests instead, and answers 429 rather than 401 once the budget is
    spent (every guess at a token is a request like any other).
    """
    budget = AddressRateThrottle()
    if budget.allow_request(request, view):
        return None
    return budget.wait()
