"""Issue, list, revoke and check API tokens; every path to a token goes through here (API, console, provisioning).

A key is `sch_` and 43 URL-safe characters (256 random bits). It is returned once, by issue_token, and stored
only as its SHA-256 digest: a stolen database or backup holds no usable key. Each token has a scope (`read`: GET
and the read-only POSTs; `write`: everything) and an end (expires_at); expired and revoked keys answer 401.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import BooleanField, ExpressionWrapper, Q
from django.db.models.functions import Now
from django_tenants.utils import schema_context

from tenants.credentials.models import ApiToken, TokenScope
from tenants.errors import FieldsInvalid, LimitReached
from tenants.models import Tenant

logger = logging.getLogger(__name__)

KEY_PREFIX = "sch_"
SHOWN_PREFIX_LENGTH = 8
MAX_TOKENS_PER_TENANT = 50
# A tenant at MAX_TOKENS_PER_TENANT is told to retry after this many seconds (429), once it revoked one.
QUOTA_RETRY_AFTER_SECONDS = 60
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._:@-]{0,99}$")
NAME_RULE = "1 to 100 characters: letters, digits, space and . _ : @ -, starting with a letter or digit."
# last_used_at is written at most this often per token: a write per request would double the cost of a GET.
LAST_USED_PRECISION = timedelta(minutes=1)


@dataclass(frozen=True)
class Issued:
    """A token just issued: the key is here and nowhere else."""

    token: ApiToken
    key: str


@dataclass(frozen=True)
class TokenPrincipal:
    """Who a request acts as once its token checked out: the token itself (DRF's request.user)."""

    token_id: int
    name: str
    scope: str
    expires_at: datetime
    is_authenticated = True
    is_anonymous = False

    @property
    def pk(self) -> int:
        return self.token_id

    @property
    def can_write(self) -> bool:
        return self.scope == TokenScope.WRITE

    def get_username(self) -> str:
        return f"token:{self.name}#{self.token_id}"

    def __str__(self) -> str:
        return self.get_username()


def digest_of(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _refuse_public(tenant: Tenant) -> None:
    if tenant.is_public:
        raise FieldsInvalid({"tenant": ["The platform's public tenant serves the console, not the API: no tokens."]})


def clean_token(
    name: object, scope: object, expires_at: datetime | None, *, now: datetime, not_after: datetime | None = None
) -> dict[str, object]:
    """The checked fields of a new token, or FieldsInvalid naming each wrong one. expires_at None: the default
    lifetime (SCHEDULER_TOKEN_DEFAULT_DAYS); at most SCHEDULER_TOKEN_MAX_DAYS ahead: no key lives forever; and
    never after `not_after` (the end of the token that issues it: a key cannot mint one that outlives it)."""
    errors: dict[str, list[str]] = {}
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        errors["name"] = [NAME_RULE]
    if scope not in TokenScope.values:
        errors["scope"] = [f"One of {', '.join(TokenScope.values)}."]
    latest = now + timedelta(days=settings.SCHEDULER_TOKEN_MAX_DAYS)
    if not_after is not None and not_after < latest:
        latest = not_after
    if expires_at is None:
        expires_at = min(now + timedelta(days=settings.SCHEDULER_TOKEN_DEFAULT_DAYS), latest)
    elif expires_at.tzinfo is None:
        errors["expires_at"] = ["An instant with its UTC offset, e.g. 2027-03-01T00:00:00Z."]
    elif expires_at <= now:
        errors["expires_at"] = ["Must be in the future."]
    elif expires_at > latest:
        errors["expires_at"] = [
            f"At most {settings.SCHEDULER_TOKEN_MAX_DAYS} days ahead, and not after the issuing token's own end "
            f"(here: {latest:%Y-%m-%dT%H:%M:%SZ})."
        ]
    if errors:
        raise FieldsInvalid(errors)
    return {"name": name, "scope": scope, "expires_at": expires_at}


def issue_token(
    tenant: Tenant,
    *,
    name: str,
    scope: str,
    actor: str,
    now: datetime,
    expires_at: datetime | None = None,
    not_after: datetime | None = None,
    bounded: bool = True,
) -> Issued:
    """A new token of the tenant; the key is in the result only. Unless `bounded` is False (an operator's
    provisioning), LimitReached when the tenant holds MAX_TOKENS_PER_TENANT tokens that have not ended."""
    _refuse_public(tenant)
    fields = clean_token(name, scope, expires_at, now=now, not_after=not_after)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    with schema_context(tenant.schema_name), transaction.atomic():
        # Serialises issuing in this schema, so two racing requests cannot both take the last place.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"issue_token:{tenant.schema_name}"])
        if bounded and ApiToken.objects.filter(expires_at__gt=now).count() >= MAX_TOKENS_PER_TENANT:
            raise LimitReached(
                f"Tenant {tenant.slug} holds {MAX_TOKENS_PER_TENANT} tokens, the most it may; revoke one first.",
                QUOTA_RETRY_AFTER_SECONDS,
            )
        token = ApiToken.objects.create(
            **fields,
            digest=digest_of(key),
            prefix=key[:SHOWN_PREFIX_LENGTH],
            created_at=now,
            created_by=actor[:200],
        )
    logger.info(
        "%s issued API token %s (%s) of tenant %s",
        actor,
        token.pk,
        token.scope,
        tenant.slug,
        extra={"action": "issue_token"},
    )
    return Issued(token=token, key=key)


def tokens_of(tenant: Tenant) -> list[ApiToken]:
    """Every token of the tenant, the oldest first (expired ones too, until revoked)."""
    _refuse_public(tenant)
    with schema_context(tenant.schema_name):
        return list(ApiToken.objects.all())


def revoke_token(tenant: Tenant, token_id: int, *, actor: str) -> bool:
    """Delete the token: its key answers 401 from the next request on. False when there was none with that id."""
    _refuse_public(tenant)
    with schema_context(tenant.schema_name):
        deleted, _ = ApiToken.objects.filter(pk=token_id).delete()
    if deleted:
        logger.warning(
            "%s revoked API token %s of tenant %s", actor, token_id, tenant.slug, extra={"action": "revoke_token"}
        )
    return bool(deleted)


class TokenRefused(Exception):
    """The key is unknown, revoked or expired (the message says which of unknown and expired: 401 either way)."""


def authenticate_key(key: str) -> TokenPrincipal:
    """The token whose key this is, in the current schema (the tenant the host names). Expiry is judged by
    PostgreSQL's clock, in the lookup itself: every web process agrees, and a request costs one statement."""
    token = (
        ApiToken.objects.filter(digest=digest_of(key))
        .annotate(
            expired=ExpressionWrapper(Q(expires_at__lte=Now()), output_field=BooleanField()),
            used_lately=ExpressionWrapper(Q(last_used_at__gt=Now() - LAST_USED_PRECISION), output_field=BooleanField()),
        )
        .only("name", "scope", "expires_at")
        .first()
    )
    if token is None:
        raise TokenRefused("Invalid token.")
    if token.expired:
        raise TokenRefused("Token expired.")
    if not token.used_lately:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=Now())
    return TokenPrincipal(token_id=token.pk, name=token.name, scope=token.scope, expires_at=token.expires_at)
