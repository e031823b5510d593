"""A tenant's credentials in the console: API tokens listed without keys, issued (the key shown once, in the answer
to that POST) and revoked; the webhook signing secret's dates and its rotation (the secret itself is the tenant's,
read through its API). Every change is a POST + CSRF and in Recent actions.

Tokens live in the tenant's own schema, as digests (tenants.credentials.tokens); the public host's console reaches
them only through those services. A key is written into a page only in the response to the POST that issued it
(never a message, which would store it in the session, never a cached page).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.cache import add_never_cache_headers
from django.utils.html import format_html

from core.clock import db_now
from dispatch.services import notification_delivery
from scheduler_project.console import log_changes, operator_actor
from tenants.credentials.models import TokenScope
from tenants.credentials.tokens import issue_token, revoke_token, tokens_of
from tenants.errors import ChangeRefused, FieldsInvalid, LimitReached
from tenants.models import Tenant
from tenants.notifications import target_of
from tenants.signing import rotate_secret, secret_state

# The lifetimes the console offers, in days (the API takes any instant up to SCHEDULER_TOKEN_MAX_DAYS).
LIFETIMES = (7, 30, 90, 365)


class TenantTokenMixin:
    """The token page of a tenant (…/<id>/token/) and the change form's line about it."""

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
        count = len(tokens_of(tenant))
        return format_html(
            '{} token{}. <a href="{}">List, issue or revoke&hellip;</a>', count, "" if count == 1 else "s", url
        )

    api_token.short_description = "API tokens"  # type: ignore[attr-defined]

    def _issue(self, request: HttpRequest, tenant: Tenant) -> str | None:
        try:
            days = int(request.POST.get("days", ""))
        except ValueError:
            days = 0
        if days not in LIFETIMES:
            messages.error(request, f"Choose a lifetime of {', '.join(map(str, LIFETIMES))} days.")
            return None
        now = db_now()
        try:
            issued = issue_token(
                tenant,
                name=request.POST.get("name", "").strip(),
                scope=request.POST.get("scope", ""),
                actor=operator_actor(request),
                now=now,
                expires_at=now + timedelta(days=days),
            )
        except FieldsInvalid as exc:
            messages.error(request, " ".join(f"{field}: {' '.join(texts)}" for field, texts in exc.errors.items()))
            return None
        except LimitReached as exc:
            messages.error(request, exc.message)
            return None
        log_changes(
            request, [(tenant, f"Issued API token {issued.token.name!r} ({issued.token.scope}, #{issued.token.pk}).")]
        )
        return issued.key

    def _revoke(self, request: HttpRequest, tenant: Tenant) -> None:
        try:
            token_id = int(request.POST.get("token", ""))
        except ValueError:
            token_id = 0
        if revoke_token(tenant, token_id, actor=operator_actor(request)):
            log_changes(request, [(tenant, f"Revoked API token #{token_id}: its key no longer authenticates.")])
            messages.success(request, f"Token #{token_id} revoked: its key no longer authenticates.")
        else:
            messages.error(request, "That token does not exist (already revoked?).")

    def token_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: the tokens (no keys). POST op=issue: a new token, its key in this answer only; op=revoke: gone."""
        tenant = self.get_object(request, object_id)  # type: ignore[attr-defined]
        if tenant is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)  # type: ignore[attr-defined]
        change_url = reverse("admin:tenants_tenant_change", args=[tenant.pk])
        if tenant.is_public:
            messages.error(request, "The platform's public tenant serves the console, not the API: it has no token.")
            return HttpResponseRedirect(change_url)
        if not self.has_view_permission(request, tenant):  # type: ignore[attr-defined]
            raise PermissionDenied
        can_change = self.has_change_permission(request, tenant)  # type: ignore[attr-defined]
        shown_key = None
        if request.method == "POST":
            if not can_change:
                raise PermissionDenied
            operation = request.POST.get("op")
            if operation == "issue":
                shown_key = self._issue(request, tenant)
            elif operation == "revoke":
                self._revoke(request, tenant)
            elif operation == "rotate_secret":
                try:
                    rotate_secret(tenant, actor=operator_actor(request), now=db_now())
                except ChangeRefused as exc:
                    messages.error(request, exc.message)
                else:
                    log_changes(request, [(tenant, "Rotated the webhook signing secret (the old one signs for 24 h).")])
                    messages.success(request, "Webhook secret rotated: calls carry both signatures for 24 hours.")
            else:
                messages.error(request, "Choose to issue or to revoke a token, or to rotate the webhook secret.")
        response = TemplateResponse(
            request,
            "admin/tenants/tenant/token.html",
            {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "original": tenant,
                "title": f"API credentials of {tenant.slug}",
                "change_url": change_url,
                "tokens": tokens_of(tenant),
                "webhook_secret": secret_state(tenant, now=db_now()),
                "notifications": target_of(tenant),
                "delivery": notification_delivery(tenant.pk),
                "now": db_now(),
                "shown_key": shown_key,
                "scopes": TokenScope.choices,
                "lifetimes": LIFETIMES,
                "can_change": can_change,
                "domain": tenant.domains.filter(is_primary=True).values_list("domain", flat=True).first(),
            },
        )
        # A key may be in this page: no browser or proxy may keep a copy.
        add_never_cache_headers(response)
        return response
