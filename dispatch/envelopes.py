"""The wire format of an envelope: the Celery protocol-2 message that carries up to SCHEDULER_ENVELOPE_SIZE
occurrences of one tenant, queue, instant and priority (grouping is dispatch/outbox.py's).

Why: on two cores one Python process confirms about 3,500 persistent messages a second but 5,600 envelopes of
100 occurrences, i.e. ~560,000 occurrences a second (ARCHITECTURE.md, "Measured"). An envelope is transport
only: each occurrence in it keeps its own id, state, attempts and fencing, and a redelivered envelope
re-offers only occurrences that are not terminal.

The body is a Celery protocol-2 task call of `dispatch.run_envelope`, serialised once, when the occurrences are
materialized; the relay sends the stored bytes untouched.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from dispatch.identity import utc_key

RUN_ENVELOPE_TASK = "dispatch.run_envelope"
BODY_VERSION = 1


def encode_body(tenant_id: int, queue: str, occurrences: Iterable[tuple[uuid.UUID, datetime]]) -> bytes:
    """The Celery protocol-2 body: [args, kwargs, embed]; the single argument is the envelope's content."""
    content = {
        "v": BODY_VERSION,
        "tenant_id": tenant_id,
        "queue": queue,
        "occurrences": [[str(occurrence_id), utc_key(scheduled_for)] for occurrence_id, scheduled_for in occurrences],
    }
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    return json.dumps([[content], {}, embed], separators=(",", ":")).encode()


def message_headers(task_id: str, count: int) -> dict[str, Any]:
    """AMQP headers that make a stored body a Celery task message (protocol 2)."""
    return {
        "lang": "py",
        "task": RUN_ENVELOPE_TASK,
        "id": task_id,
        "root_id": task_id,
        "parent_id": None,
        "group": None,
        "shadow": None,
        "eta": None,
        "expires": None,
        "retries": 0,
        "timelimit": [None, None],
        "argsrepr": f"<envelope of {count}>",
        "kwargsrepr": "{}",
        "origin": "scheduler-relay",
        "ignore_result": True,
    }


def task_id_for(outbox_id: int) -> str:
    return f"envelope-{outbox_id}"


class MalformedEnvelope(ValueError):
    """A message on our queues that is not an envelope we wrote: logged and dropped by the worker."""


def decode_content(content: Any) -> list[tuple[uuid.UUID, datetime]]:
    """The (occurrence_id, scheduled_for) pairs of an envelope argument; raises MalformedEnvelope."""
    if not isinstance(content, dict) or content.get("v") != BODY_VERSION:
        raise MalformedEnvelope(f"not an envelope of version {BODY_VERSION}: {str(content)[:200]!r}")
    pairs = content.get("occurrences")
    if not isinstance(pairs, list):
        raise MalformedEnvelope("envelope without an occurrences list")
    decoded = []
    for pair in pairs:
        try:
            occurrence_id, scheduled_for = pair
            instant = datetime.strptime(scheduled_for, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
            decoded.append((uuid.UUID(occurrence_id), instant))
        except (AttributeError, TypeError, ValueError) as exc:  # uuid.UUID(<not text>) raises AttributeError
            raise MalformedEnvelope(f"bad occurrence entry {str(pair)[:100]!r}: {exc}") from None
    return decoded
