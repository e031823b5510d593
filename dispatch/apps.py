"""Data plane: occurrences, attempts, the outbox, the materializer, the relay and the workers."""

from django.apps import AppConfig


class DispatchConfig(AppConfig):
    name = "dispatch"
    verbose_name = "Dispatch"

    def ready(self) -> None:
        """Register every handler module in every process, so the API validates the same names workers run."""
        from importlib import import_module

        from dispatch.celeryconfig import handler_modules

        for module in handler_modules():
            import_module(module)
