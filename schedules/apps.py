"""Control plane: schedules, their version history, time rules, services, API and admin."""

from django.apps import AppConfig


class SchedulesConfig(AppConfig):
    name = "schedules"
    verbose_name = "Schedules"
