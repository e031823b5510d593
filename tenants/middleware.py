"""Host-based tenant selection with a clear JSON 404 for a host no tenant owns, or no host at all."""

from __future__ import annotations

from django.core.exceptions import DisallowedHost
from django.http import JsonResponse
from django_tenants.middleware.main import TenantMainMiddleware


class TenantHostMiddleware(TenantMainMiddleware):
    """django-tenants' middleware; an unknown host gets a JSON 404 instead of an HTML error page."""

    @staticmethod
    def hostname_from_request(request):
        """Host names are case-insensitive and may end with a root dot (RFC 1034): normalise before lookup."""
        return TenantMainMiddleware.hostname_from_request(request).lower().rstrip(".")

    def process_request(self, request):
        # django-tenants answers a Host header that is not a host name at all (`\w,!?`, a bad port) with an empty
        # text/html 404; the API answers every error in JSON.
        try:
            request.get_host()
        except DisallowedHost:
            return JsonResponse({"detail": "The Host header does not name a host this server serves."}, status=404)
        return super().process_request(request)

    def no_tenant_found(self, request, hostname):
        return JsonResponse({"detail": f"No tenant is served at host '{hostname}'."}, status=404)
