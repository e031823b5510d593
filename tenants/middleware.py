"""Host-based tenant selection with a clear 404 for a host no tenant owns."""

from __future__ import annotations

from django.http import JsonResponse
from django_tenants.middleware.main import TenantMainMiddleware


class TenantHostMiddleware(TenantMainMiddleware):
    """django-tenants' middleware; an unknown host gets a JSON 404 instead of an HTML error page."""

    @staticmethod
    def hostname_from_request(request):
        """Host names are case-insensitive and may end with a root dot (RFC 1034): normalise before lookup."""
        return TenantMainMiddleware.hostname_from_request(request).lower().rstrip(".")

    def no_tenant_found(self, request, hostname):
        return JsonResponse({"detail": f"No tenant is served at host '{hostname}'."}, status=404)
