"""A local HTTP target for the webhook handler's tests (scripted replies, every request recorded) and the fixtures
that deliver a webhook occurrence through claim → run → complete."""

from __future__ import annotations

import json
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import dispatch.handlers.webhook  # noqa: F401 - registers the "webhook" handler
from dispatch.engine.claims import Claim, try_claim
from dispatch.engine.execution import complete, run_claimed
from dispatch.models import Attempt, Occurrence, OccurrenceState

BASE = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=5)


@dataclass
class Reply:
    status: int = 200
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes = b""


class Target:
    """A local HTTP server that answers with scripted replies (200 once the script is used up) and records
    every request it receives."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.received: list[Received] = []
        self.stop = threading.Event()
        target = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                target.received.append(
                    Received(self.command, self.path, dict(self.headers), json.loads(raw or b"null"), raw)
                )
                reply = target.replies.popleft() if target.replies else Reply()
                if reply.delay and target.stop.wait(reply.delay):
                    return
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            do_PUT = do_PATCH = do_DELETE = do_POST

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def script(self, *replies: Reply | int) -> None:
        self.replies.extend(r if isinstance(r, Reply) else Reply(r) for r in replies)


@pytest.fixture
def target() -> Iterator[Target]:
    server = Target()
    server.thread.start()
    try:
        yield server
    finally:
        server.stop.set()
        server.server.shutdown()
        server.server.server_close()


@pytest.fixture
def webhook_occurrence(make_schedule, make_occurrence) -> Callable[..., Occurrence]:
    """An enqueued occurrence at BASE of a fresh every-minute "webhook" schedule with `payload`."""

    def make(tenant, payload: dict[str, Any], **fields: Any) -> Occurrence:
        # BASE is minutes back: a lateness the schedule accepts (the claim's misfire rule is not tested here).
        fields = {
            "name": f"hook-{uuid.uuid4().hex[:8]}",
            "handler": "webhook",
            "payload": payload,
            "max_lateness_seconds": 3600,
            **fields,
        }
        return make_occurrence(make_schedule(tenant, **fields), at=BASE, state=OccurrenceState.ENQUEUED)

    return make


def deliver(occurrence: Occurrence, now: datetime | None = None) -> str:
    """One delivery through the worker service (no heartbeat thread: these tests roll back their rows)."""
    claimed = try_claim(occurrence.occurrence_id, occurrence.scheduled_for, "test-worker", now=now)
    assert isinstance(claimed, Claim)
    assert claimed is not None
    return complete(claimed, run_claimed(claimed, renew_lease=False), now=now)


def last_attempt(occurrence: Occurrence) -> Attempt:
    return Attempt.objects.filter(occurrence_id=occurrence.occurrence_id).order_by("-generation").first()
