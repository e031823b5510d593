"""Per-tenant API request rate: one noisy tenant cannot starve the control plane for the others."""

from __future__ import annotations

from rest_framework.throttling import SimpleRateThrottle


class TenantRateThrottle(SimpleRateThrottle):
    scope = "tenant"

    def get_cache_key(self, request, view) -> str | None:
        tenant = getattr(request, "tenant", None)
        if tenant is None or tenant.schema_name == "public":
            return None
        return self.cache_format % {"scope": self.scope, "ident": tenant.schema_name}
