"""Routes of the tenant API under /api/v1/."""

from __future__ import annotations

from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import SimpleRouter

from schedules.api.calendars import CalendarViewSet
from schedules.api.credentials import TokenViewSet, WebhookSecretRotateView, WebhookSecretView
from schedules.api.notifications import NotificationsView
from schedules.api.views import OccurrenceViewSet, ScheduleViewSet

router = SimpleRouter()
router.register("schedules", ScheduleViewSet, basename="schedule")
router.register("occurrences", OccurrenceViewSet, basename="occurrence")
router.register("calendars", CalendarViewSet, basename="calendar")
router.register("tokens", TokenViewSet, basename="token")

urlpatterns = [
    path("schema/", SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[]), name="schema"),
    path(
        "docs/",
        SpectacularSwaggerSplitView.as_view(url_name="schema", authentication_classes=[], permission_classes=[]),
        name="docs",
    ),
    path("webhook-secret/", WebhookSecretView.as_view(), name="webhook-secret"),
    path("webhook-secret/rotate/", WebhookSecretRotateView.as_view(), name="webhook-secret-rotate"),
    path("notifications/", NotificationsView.as_view(), name="notifications"),
    path("", include(router.urls)),
]
