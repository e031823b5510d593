"""Operator console for the control plane: schedules listed in words and local time, changed only through services."""

from __future__ import annotations

from django.contrib import admin

# Django's autodiscovery imports only this package: importing the modules registers ScheduleAdmin, CalendarAdmin.
from schedules.admin import calendar, schedule  # noqa: F401

admin.site.site_header = "Scheduler operator console"
admin.site.site_title = "Scheduler operator console"
admin.site.index_title = "Operations"
# The public host serves no site at "/": the header links to /metrics instead (templates/admin/base_site.html).
admin.site.site_url = None
# The lists are wide (an occurrence has ten columns, a schedule ten) and sit beside their filters; the navigation
# sidebar would take another 280 px and clip them at 1440 px. The index lists every model and each page has its
# breadcrumbs, so the sidebar added no way to get anywhere.
admin.site.enable_nav_sidebar = False
