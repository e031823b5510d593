"""DRF authentication and permission for tenant API tokens (tenants.credentials.tokens does the checking)."""

from __future__ import annotations

from typing import Any

from django.db import connection
from rest_framework import exceptions, permissions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

from tenants.credentials.tokens import TokenPrincipal, TokenRefused, authenticate_key

KEYWORD = "Token"


class DigestTokenAuthentication(BaseAuthentication):
    """`Authorization: Token <key>`, looked up by digest in the schema of the tenant the host names."""

    def authenticate(self, request: Request) -> tuple[TokenPrincipal, TokenPrincipal] | None:
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != KEYWORD.lower().encode():
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Invalid token header: expected 'Token <key>'.")
        try:
            key = parts[1].decode("ascii")
        except UnicodeError:
            raise exceptions.AuthenticationFailed("Invalid token.") from None
        if connection.schema_name == "public":
            # The public host serves operators; it has no token table and no tenant API.
            return None
        try:
            principal = authenticate_key(key)
        except TokenRefused as refused:
            raise exceptions.AuthenticationFailed(str(refused)) from None
        return principal, principal

    def authenticate_header(self, request: Request) -> str:
        return KEYWORD


class TokenScopePermission(permissions.BasePermission):
    """A `read` token may GET, and POST to the actions a view lists in `read_scope_actions` (previews, which
    change nothing); everything else needs a `write` token (403 otherwise)."""

    message = "This token has the read scope; this call needs a token with the write scope."

    def has_permission(self, request: Request, view: Any) -> bool:
        principal = request.user
        if not isinstance(principal, TokenPrincipal) or principal.can_write:
            return True
        if request.method in permissions.SAFE_METHODS:
            return True
        return getattr(view, "action", None) in getattr(view, "read_scope_actions", ())


class WriteScopeOnly(permissions.BasePermission):
    """Every method of the view needs a write token: reading what it shows (a signing secret) is a power too."""

    message = "This token has the read scope; this call needs a token with the write scope."

    def has_permission(self, request: Request, view: Any) -> bool:
        principal = request.user
        return not isinstance(principal, TokenPrincipal) or principal.can_write
