"""Data plane: occurrences, attempts, the outbox, the materializer, the relay and the workers."""

from django.apps import AppConfig


class DispatchConfig(AppConfig):
    name = "dispatch"
    verbose_name = "Dispatch"
