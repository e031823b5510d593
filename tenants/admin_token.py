"""A tenant's API token in the console: shown on request, rotated with POST + CSRF, each use in Recent actions.

Tokens live in the tenant's own schema (tenants.services); the public host's console reaches them only through
those services. A key is written into a page only in the response to the POST that asked for it (never a message,
which would store it in the session, never a cached page).
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html

from scheduler_project.console import log_changes
from tenants.models import Tenant
from tenants.services import api_token, rotate_api_token


class TenantTokenMixin:
    """The token page of a tenant (…/<id>/token/) and the change form's link to it."""

    admin_site: Any
    opts: Any

    def get_urls(self) -> list:
        wrap = self.admin_site.admin_view
        return [
            path("<path:object_id>/token/", wrap(self.token_view), name="tenants_tenant_token"),
            *super().get_urls(),  # type: ignore[misc]
        ]

    def api_token(self, tenant: Tenant) -> str:
        if tenant.pk is None or tenant.is_public:
            return "—"
        url = reverse("admin:tenants_tenant_token", args=[tenant.pk])
        token = api_token(tenant)
        if token is None:
            return format_html('None yet. <a href="{}">Create one&hellip;</a>', url)
        return format_html(
            'User "{}", key {} (created {} UTC). <a href="{}">Show or rotate&hellip;</a>',
            token.username,
            token.hint,
            f"{token.created:%Y-%m-%d %H:%M}",
            url,
        )

    api_token.short_description = "API token"  # type: ignore[attr-defined]

    def token_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: the token's user, age and hint. POST op=reveal: the key; op=rotate: a new key, the old one dead."""
        tenant = self.get_object(request, object_id)  # type: ignore[attr-defined]
        if tenant is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)  # type: ignore[attr-defined]
        change_url = reverse("admin:tenants_tenant_change", args=[tenant.pk])
        if tenant.is_public:
            messages.error(request, "The platform's public tenant serves the console, not the API: it has no token.")
            return HttpResponseRedirect(change_url)
        if not self.has_view_permission(request, tenant):  # type: ignore[attr-defined]
            raise PermissionDenied
        shown_key, rotated = None, False
        if request.method == "POST":
            if not self.has_change_permission(request, tenant):  # type: ignore[attr-defined]
                raise PermissionDenied
            operation = request.POST.get("op")
            try:
                if operation == "rotate":
                    shown_key, rotated = rotate_api_token(tenant).key, True
                    log_changes(request, [(tenant, "Rotated the API token: the old key no longer authenticates.")])
                elif operation == "reveal":
                    current = api_token(tenant)
                    shown_key = current.key if current else None
                    log_changes(request, [(tenant, "Showed the API token.")])
                else:
                    messages.error(request, "Choose to show or to rotate the token.")
            except ValidationError as exc:
                messages.error(request, " ".join(exc.messages))
        response = TemplateResponse(
            request,
            "admin/tenants/tenant/token.html",
            {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "original": tenant,
                "title": f"API token of {tenant.slug}",
                "change_url": change_url,
                "token": api_token(tenant),
                "shown_key": shown_key,
                "rotated": rotated,
                "can_change": self.has_change_permission(request, tenant),  # type: ignore[attr-defined]
                "domain": tenant.domains.filter(is_primary=True).values_list("domain", flat=True).first(),
            },
        )
        # The key is in this page: no browser or proxy may keep a copy.
        add_never_cache_headers(response)
        return response
