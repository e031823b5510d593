"""Routes of the public host: the operator console, metrics and health."""

from django.contrib import admin
from django.templatetags.static import static
from django.urls import path
from django.views.generic import RedirectView
from rest_framework.authtoken.models import TokenProxy

from scheduler_project.console_site import tidy_index
from scheduler_project.health import healthz
from scheduler_project.metrics import metrics
from scheduler_project.metrics_page import console_metrics
from scheduler_project.unavailable import console_server_error

# API tokens live in each tenant's own schema; the public schema (this host's) has no token table, so the admin that
# rest_framework.authtoken registers would be a page that can only fail. It registers itself last (its app comes
# after ours), so it is taken off here, once every admin module has been imported.
if admin.site.is_registered(TokenProxy):
    admin.site.unregister(TokenProxy)
# Likewise, the index lists the security tables for superusers only and no app whose tables stay empty here.
tidy_index(admin.site)

urlpatterns = [
    # The metrics as the console shows them, before the admin's own routes (its app pages take any first segment).
    path("admin/metrics/", admin.site.admin_view(console_metrics), name="console-metrics"),
    path("admin/", admin.site.urls),
    path("metrics", metrics, name="metrics"),
    path("healthz", healthz, name="healthz"),
    # Pages without an icon link (/metrics as text, an API answer opened in a browser) still ask for this one.
    path("favicon.ico", RedirectView.as_view(url=static("schedules/favicon.svg"), permanent=True)),
]

handler500 = console_server_error
