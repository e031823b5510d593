"""Operator console for the data plane: occurrences with their timelines, attempts, the outbox; replay from the DLQ.

Django's autodiscovery imports only this package: importing the modules registers their admins.
"""

from __future__ import annotations

from dispatch.admin import attempts, occurrences, outbox  # noqa: F401
