"""Host-based tenant selection with a clear 404 for a host no tenant owns."""

from __future__ import annotations

from django.http import JsonResponse
from django_tenants.middleware.main import TenantMainMiddleware


class TenantHostMiddleware(TenantMainMiddleware):
    """django-tenants' middleware; an unknown host gets a JSON 404 instead of an HTML error page."""

    def no_tenant_found(self, request, hostname):
        return JsonResponse({"detail": f"No tenant is served at host '{hostname}'."}, status=404)
