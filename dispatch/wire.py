"""The wire format of an envelope: the Celery protocol-2 message that carries up to SCHEDULER_ENVELOPE_SIZE
occurrences of one tenant, queue, instant and priority (grouping is dispatch/outbox.py's), or a bundle of such
envelopes of several tenants sent as one message (`bundle_body`).

Why: on two cores one Python process confirms about 3,500 persistent messages a second but 5,600 envelopes of
100 occurrences, i.e. ~560,000 occurrences a second (docs/ARCHITECTURE.md, "Measured"). An envelope is
transport only: each occurrence in it keeps its own id, state, attempts and fencing, and a redelivered envelope
re-offers only occurrences that are not terminal.

The body is a Celery protocol-2 task call of `dispatch.run_envelope`, serialised once, when the occurrences are
materialized; the relay sends the stored bytes untouched.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from dispatch.identity import utc_key

RUN_ENVELOPE_TASK = "dispatch.run_envelope"
# What encode_body writes: {"v": 2, "tenant_id", "queue", "fires": {"<UTC instant>": ["<occurrence id>", ...]}}.
# The ids are grouped by their scheduled instant, which all fires of a strict envelope share: 39 bytes a fire on
# the wire instead of 70 with an [id, instant] pair each, so a 500,000-fire burst is 20 MB for the broker to
# persist instead of 35, and a worker parses one instant per envelope instead of one per fire.
BODY_VERSION = 2
# The first format, {"v": 1, ..., "occurrences": [[id, instant], ...]}: still read, since messages written before
# an upgrade may wait in the queues when the new workers start.
PAIRS_BODY_VERSION = 1


# What follows the args of every body encode_body writes: the empty kwargs and the embed, then the list's end.
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
_BODY_HEAD = b"[["
_BODY_TAIL = b"],{}," + json.dumps(_EMBED, separators=(",", ":")).encode() + b"]"


def encode_body(tenant_id: int, queue: str, occurrences: Iterable[tuple[uuid.UUID, datetime]]) -> bytes:
    """The Celery protocol-2 body: [args, kwargs, embed]; the single argument is the envelope's content."""
    by_instant: dict[datetime, list[uuid.UUID]] = {}
    for occurrence_id, scheduled_for in occurrences:
        by_instant.setdefault(scheduled_for, []).append(occurrence_id)
    # Keyed by the instant's text once per instant (a strict envelope has one), not once per fire.
    fires: dict[str, list[str]] = {}
    for scheduled_for, ids in by_instant.items():
        fires.setdefault(utc_key(scheduled_for), []).extend(map(str, ids))
    content = {"v": BODY_VERSION, "tenant_id": tenant_id, "queue": queue, "fires": fires}
    return json.dumps([[content], {}, _EMBED], separators=(",", ":")).encode()


def bundle_body(envelopes: Sequence[tuple[int, bytes]]) -> bytes:
    """One message body carrying stored envelopes (outbox id, body), usually one: the task's arguments are their
    contents, one each, each naming its outbox row as "envelope".

    The relay sends the small envelopes of many tenants that fall due at one instant on one queue as one message
    (a steady day spread over a thousand tenants is ~1,000 envelopes of two or three fires a second, and a message
    and a Celery task each is what the worker cannot afford; docs/DESIGN.md "Bundles"). Each envelope keeps its
    row, its tenant's quotas and its stamp; only the transport is shared. The outbox id lets the worker's completion
    copy the envelope's confirmation stamp (docs/DESIGN.md "Settling keeps up"); workers that predate it ignore the
    key. A stored body is `[[content],{},embed]` as encode_body wrote it: its content is cut out by bytes, without
    parsing; a body of another shape is parsed.
    """
    contents: list[bytes] = []
    for envelope_id, body in envelopes:
        raw = bytes(body)
        named = b'{"envelope":%d,' % envelope_id
        if raw.startswith(_BODY_HEAD + b"{") and raw.endswith(_BODY_TAIL):
            content = raw[len(_BODY_HEAD) : -len(_BODY_TAIL)]
            contents.append(named + content[1:] if content != b"{}" else named[:-1] + b"}")
        else:
            for arg in json.loads(raw)[0]:
                if isinstance(arg, dict):
                    arg = {"envelope": envelope_id, **arg}
                contents.append(json.dumps(arg, separators=(",", ":")).encode())
    return _BODY_HEAD + b",".join(contents) + _BODY_TAIL


def envelope_id_of(content: Any) -> int | None:
    """The outbox id an envelope argument names (bundle_body), or None (an older relay's message, a hand-made one)."""
    envelope_id = content.get("envelope") if isinstance(content, dict) else None
    return envelope_id if isinstance(envelope_id, int) and not isinstance(envelope_id, bool) else None


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
    """The (occurrence_id, scheduled_for) pairs of an envelope argument, of either version; raises
    MalformedEnvelope."""
    version = content.get("v") if isinstance(content, dict) else None
    if isinstance(version, bool):  # True == 1 in Python, but not a version
        version = None
    if version == BODY_VERSION:
        fires = content.get("fires")
        if not isinstance(fires, dict):
            raise MalformedEnvelope("envelope without a fires object")
        decoded: list[tuple[uuid.UUID, datetime]] = []
        for scheduled_for, ids in fires.items():
            if not isinstance(ids, list):
                raise MalformedEnvelope(f"bad fires entry {str({scheduled_for: ids})[:100]!r}: not a list of ids")
            instant = _instant(scheduled_for, ids)
            decoded.extend((_occurrence_id(occurrence_id, scheduled_for), instant) for occurrence_id in ids)
        return decoded
    if version == PAIRS_BODY_VERSION:
        pairs = content.get("occurrences")
        if not isinstance(pairs, list):
            raise MalformedEnvelope("envelope without an occurrences list")
        decoded = []
        for pair in pairs:
            if not isinstance(pair, list) or len(pair) != 2:
                raise MalformedEnvelope(f"bad occurrence entry {str(pair)[:100]!r}: not an [id, instant] pair")
            occurrence_id, scheduled_for = pair
            decoded.append((_occurrence_id(occurrence_id, scheduled_for), _instant(scheduled_for, pair)))
        return decoded
    raise MalformedEnvelope(
        f"not an envelope of version {PAIRS_BODY_VERSION} or {BODY_VERSION}: {str(content)[:200]!r}"
    )


def _instant(text: Any, entry: Any) -> datetime:
    try:
        return _parse_utc_key(text)
    except (TypeError, ValueError) as exc:
        raise MalformedEnvelope(f"bad occurrence entry {str(entry)[:100]!r}: {exc}") from None


@functools.lru_cache(maxsize=4096)
def _parse_utc_key(text: str) -> datetime:
    """An instant as utc_key writes it. Cached: the fires of a bundle share a few instants, and strptime was 6 % of
    a worker's CPU under steady load."""
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


def _occurrence_id(text: Any, entry: Any) -> uuid.UUID:
    if not isinstance(text, str):
        raise MalformedEnvelope(f"bad occurrence entry {str([text, entry])[:100]!r}: the id is not text")
    try:
        return uuid.UUID(text)
    except ValueError as exc:
        raise MalformedEnvelope(f"bad occurrence entry {str([text, entry])[:100]!r}: {exc}") from None
