"""The built-in webhook handler against a real HTTP server on 127.0.0.1, through claim → run → complete."""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest

import dispatch.handlers.webhook as webhook_module  # registers the "webhook" handler
from core.clock import db_now
from dispatch.engine.claims import Claim, try_claim
from dispatch.engine.execution import run_claimed
from dispatch.identity import utc_key
from dispatch.models import OccurrenceState
from schedules.models import Schedule
from tests.integration.slow_target import Exchange, SlowTarget, header_drip, slow_target
from tests.integration.webhook_target import Reply, deliver, last_attempt
from tests.support import wait_for


def test_the_webhook_posts_the_body_with_the_occurrence_id_as_idempotency_key(tenant, target, webhook_occurrence):
    occurrence = webhook_occurrence(tenant, {"url": f"{target.url}/hook?x=1", "body": {"report": "daily", "n": 1}})

    assert deliver(occurrence) == OccurrenceState.SUCCEEDED

    (request,) = target.received
    assert (request.method, request.path, request.body) == ("POST", "/hook?x=1", {"report": "daily", "n": 1})
    assert request.headers["Idempotency-Key"] == str(occurrence.occurrence_id)
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["X-Scheduled-For"] == utc_key(occurrence.scheduled_for)


def test_without_a_body_the_payload_minus_its_control_keys_is_posted(tenant, target, webhook_occurrence):
    occurrence = webhook_occurrence(tenant, {"url": target.url, "timeout_seconds": 5, "customer": 42, "tags": ["a"]})

    assert deliver(occurrence) == OccurrenceState.SUCCEEDED

    assert target.received[0].body == {"customer": 42, "tags": ["a"]}


def test_a_500_then_a_200_retries_then_succeeds_with_the_same_idempotency_key(tenant, target, webhook_occurrence):
    target.script(500, 200)
    occurrence = webhook_occurrence(tenant, {"url": target.url, "body": {}})
    now = db_now()

    assert deliver(occurrence, now=now) == OccurrenceState.RETRY_WAIT
    assert last_attempt(occurrence).error_class == "transient"
    assert "answered 500" in last_attempt(occurrence).error
    occurrence.refresh_from_db()
    assert deliver(occurrence, now=occurrence.available_at) == OccurrenceState.SUCCEEDED

    assert [r.headers["Idempotency-Key"] for r in target.received] == [str(occurrence.occurrence_id)] * 2
    assert [r.headers["X-Attempt"] for r in target.received] == ["1", "2"]


@pytest.mark.parametrize("status", [400, 401, 404, 410, 422])
def test_a_4xx_goes_dead_without_a_retry(tenant, target, status, webhook_occurrence):
    target.script(status)
    occurrence = webhook_occurrence(tenant, {"url": target.url})

    assert deliver(occurrence) == OccurrenceState.DEAD

    attempt = last_attempt(occurrence)
    assert (attempt.outcome, attempt.error_class) == ("failed", "permanent")
    assert f"answered {status}" in attempt.error
    assert len(target.received) == 1


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503])
def test_408_429_and_5xx_are_transient(tenant, target, status, webhook_occurrence):
    target.script(status)
    occurrence = webhook_occurrence(tenant, {"url": target.url})

    assert deliver(occurrence) == OccurrenceState.RETRY_WAIT
    assert last_attempt(occurrence).error_class == "transient"


def test_retry_after_is_a_floor_for_the_backoff(tenant, target, webhook_occurrence):
    target.script(Reply(429, headers={"Retry-After": "120"}))
    occurrence = webhook_occurrence(tenant, {"url": target.url})
    now = db_now()

    assert deliver(occurrence, now=now) == OccurrenceState.RETRY_WAIT

    occurrence.refresh_from_db()
    assert occurrence.available_at >= now + timedelta(seconds=120)


def test_a_timeout_is_transient(tenant, target, webhook_occurrence):
    target.script(Reply(200, delay=5))
    occurrence = webhook_occurrence(tenant, {"url": target.url, "timeout_seconds": 0.3})

    assert deliver(occurrence) == OccurrenceState.RETRY_WAIT

    attempt = last_attempt(occurrence)
    assert attempt.error_class == "transient"
    assert "timed out" in attempt.error


def test_a_refused_connection_is_transient(tenant, webhook_occurrence):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again at once: nothing listens there
    occurrence = webhook_occurrence(tenant, {"url": f"http://127.0.0.1:{port}/"})

    assert deliver(occurrence) == OccurrenceState.RETRY_WAIT
    assert last_attempt(occurrence).error_class == "transient"


BAD_URLS = [
    "file:///etc/passwd",
    "ftp://example.com/x",
    "http://",
    "not a url",
    None,
    "https://user:secret@example.com/hook",
    f"https://{'a' * 64}.example.com/hook",
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_url_no_call_can_use_is_a_400_on_create_naming_the_payload(api_a, url):
    payload = {"url": url} if url is not None else {}
    body = {"name": "hook", "kind": "cron", "cron": "* * * * *", "handler": "webhook", "payload": payload}

    response = api_a.post("/api/v1/schedules/", body, format="json")

    assert response.status_code == 400, response.content
    assert "payload.url" in " ".join(response.json()["payload"])


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_stored_url_no_call_can_use_is_refused_as_permanent(tenant, target, url, webhook_occurrence):
    """Saved before the check existed: the call is not made and not retried (a 64-character label raised a bare
    UnicodeError that was retried as transient)."""
    occurrence = webhook_occurrence(tenant, {"url": target.url})
    payload = {"url": url} if url is not None else {}
    Schedule.objects.filter(pk=occurrence.schedule_id).update(payload=payload)

    assert deliver(occurrence) == OccurrenceState.DEAD
    assert last_attempt(occurrence).error_class == "permanent"
    assert target.received == []


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({"method": "TRACE"}, "payload.method"),
        ({"headers": {"Host": "evil.example"}}, "may not set Host"),
        ({"headers": {"webhook-signature": "v1,x"}}, "may not set webhook-signature"),
        ({"headers": {"X-Bad": "a\r\nInjected: 1"}}, "one line"),
        ({"headers": ["Authorization: x"]}, "must be an object"),
        ({"timeout_seconds": "soon"}, "timeout_seconds"),
        ({"timeout_seconds": 0}, "timeout_seconds"),
    ],
)
def test_a_bad_method_header_or_timeout_is_a_400_on_create(api_a, payload, fragment):
    body = {
        "name": "hook",
        "kind": "cron",
        "cron": "* * * * *",
        "handler": "webhook",
        "payload": {"url": "https://example.com/hook", **payload},
    }

    response = api_a.post("/api/v1/schedules/", body, format="json")

    assert response.status_code == 400, response.content
    assert fragment in " ".join(response.json()["payload"])


def test_a_literal_private_address_is_refused_on_create_unless_the_operator_allows_it(api_a, settings):
    body = {"name": "hook", "kind": "cron", "cron": "* * * * *", "handler": "webhook"}
    settings.SCHEDULER_WEBHOOK_ALLOW_PRIVATE = False
    for url in ("http://127.0.0.1:9/hook", "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/"):
        refused = api_a.post("/api/v1/schedules/", {**body, "payload": {"url": url}}, format="json")
        assert refused.status_code == 400 and "private" in " ".join(refused.json()["payload"]), url
    settings.SCHEDULER_WEBHOOK_ALLOW_PRIVATE = True
    allowed = api_a.post("/api/v1/schedules/", {**body, "payload": {"url": "http://127.0.0.1:9/hook"}}, format="json")
    assert allowed.status_code == 201, allowed.content


def test_the_method_and_headers_are_sent_and_stay_out_of_the_body(tenant, target, webhook_occurrence):
    occurrence = webhook_occurrence(
        tenant,
        {
            "url": f"{target.url}/orders",
            "method": "PUT",
            "headers": {"Authorization": "Bearer abc", "X-Team": "payments", "Idempotency-Key": "mine"},
            "customer": 42,
        },
    )

    assert deliver(occurrence) == OccurrenceState.SUCCEEDED

    (request,) = target.received
    assert (request.method, request.path, request.body) == ("PUT", "/orders", {"customer": 42})
    assert (request.headers["Authorization"], request.headers["X-Team"]) == ("Bearer abc", "payments")
    assert request.headers["Idempotency-Key"] == str(occurrence.occurrence_id), "the platform's key, not the payload's"


def test_the_log_and_the_error_show_no_credentials_or_query(tenant, target, webhook_occurrence, caplog):
    target.script(404)
    occurrence = webhook_occurrence(tenant, {"url": f"{target.url}/hook?token=s3cret"})

    with caplog.at_level("INFO"):
        assert deliver(occurrence) == OccurrenceState.DEAD

    assert "s3cret" not in caplog.text
    assert "s3cret" not in (last_attempt(occurrence).error or "")
    assert "/hook" in (last_attempt(occurrence).error or "")


def test_a_redirect_is_not_followed(tenant, target, webhook_occurrence):
    target.script(Reply(302, headers={"Location": f"{target.url}/elsewhere"}))
    occurrence = webhook_occurrence(tenant, {"url": target.url})

    assert deliver(occurrence) == OccurrenceState.DEAD

    assert [r.path for r in target.received] == ["/"]


def test_an_absurd_timeout_is_capped(tenant, target, webhook_occurrence):
    capped = webhook_occurrence(tenant, {"url": target.url, "timeout_seconds": 3600})
    assert deliver(capped) == OccurrenceState.SUCCEEDED


# --- the whole call under one deadline -------------------------------------------------------------------------


@pytest.fixture
def slow(request) -> Iterator[SlowTarget]:
    """A raw receiver running the script a test names (`@pytest.mark.parametrize("slow", [...], indirect=True)`)."""
    yield from slow_target(request.param)


def _status_then_cut(exchange: Exchange) -> bool:
    exchange.send(b"HTTP/1.1 200 OK\r\nX-First: 1\r\n")
    return False  # the connection closes mid-headers


def _body_cut_short(exchange: Exchange) -> bool:
    exchange.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
    return False


def _chunked_body_cut_short(exchange: Exchange) -> bool:
    exchange.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n20\r\n0123456789")
    return False


def _body_drip(exchange: Exchange) -> bool:
    """Headers at once, then a 40-byte body one byte every 0.3 s (12 s in all)."""
    return exchange.send(b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n") and exchange.drip([b"x"] * 40, 0.3)


@pytest.mark.parametrize("slow", [header_drip(lines=30, every=0.3)], indirect=True, ids=["drip"])
def test_a_target_that_drips_its_headers_is_cut_off_at_the_deadline_and_the_call_is_no_success(
    tenant, slow, webhook_occurrence
):
    # Each line comes well within the timeout, so a per-read timeout never fires; the whole answer takes 9 s.
    occurrence = webhook_occurrence(tenant, {"url": slow.url, "timeout_seconds": 1})

    assert deliver(occurrence) == OccurrenceState.RETRY_WAIT

    attempt = last_attempt(occurrence)
    assert (attempt.outcome, attempt.error_class) == ("failed", "transient")
    assert "timed out" in attempt.error and "within 1.0 s" in attempt.error
    (exchange,) = slow.exchanges
    wait_for(lambda: exchange.closed_at is not None, 15, "the caller to hang up")
    assert not exchange.answered, "the caller hung up before the answer was whole"
    assert exchange.sent_steps < 15, f"{exchange.sent_steps} lines of 31 were sent before the caller hung up"


@pytest.mark.parametrize("slow", [_body_drip], indirect=True, ids=["drip"])
def test_a_body_dripping_past_the_deadline_is_no_success(tenant, slow, webhook_occurrence):
    occurrence = webhook_occurrence(tenant, {"url": slow.url, "timeout_seconds": 1})

    assert deliver(occurrence) == OccurrenceState.RETRY_WAIT

    assert "timed out" in last_attempt(occurrence).error
    (exchange,) = slow.exchanges
    wait_for(lambda: exchange.closed_at is not None, 15, "the caller to hang up")
    assert not exchange.answered


@pytest.mark.parametrize(
    "slow",
    [_status_then_cut, _body_cut_short, _chunked_body_cut_short],
    indirect=True,
    ids=["headers", "body", "chunk"],
)
def test_a_connection_cut_mid_answer_is_a_transient_error_not_a_success(tenant, slow, webhook_occurrence):
    occurrence = webhook_occurrence(tenant, {"url": slow.url, "timeout_seconds": 5})

    assert deliver(occurrence) == OccurrenceState.RETRY_WAIT

    attempt = last_attempt(occurrence)
    assert attempt.error_class == "transient"
    assert "incomplete or malformed answer" in attempt.error


@pytest.mark.parametrize("slow", [header_drip(lines=3, every=0.1)], indirect=True, ids=["drip"])
def test_a_slow_answer_that_completes_within_the_deadline_succeeds(tenant, slow, webhook_occurrence):
    occurrence = webhook_occurrence(tenant, {"url": slow.url, "timeout_seconds": 10})

    assert deliver(occurrence) == OccurrenceState.SUCCEEDED
    (exchange,) = slow.exchanges
    # The caller may read the last byte before the target's thread records that it sent it.
    wait_for(lambda: exchange.answered, timeout=5, what="the target to record its whole answer")
    assert b"Idempotency-Key: " + str(occurrence.occurrence_id).encode() in exchange.request


@pytest.mark.parametrize("slow", [header_drip(lines=60, every=0.2)], indirect=True, ids=["drip"])
def test_the_cancel_event_ends_a_call_in_flight(tenant, slow, webhook_occurrence):
    occurrence = webhook_occurrence(tenant, {"url": slow.url, "timeout_seconds": 30})
    claimed = try_claim(occurrence.occurrence_id, occurrence.scheduled_for, "test-worker")
    assert isinstance(claimed, Claim)
    cancel = threading.Event()

    def cancel_once_the_answer_has_begun() -> None:
        wait_for(lambda: slow.exchanges and slow.exchanges[0].sent_steps >= 2, 15, "two steps sent")
        cancel.set()

    canceller = threading.Thread(target=cancel_once_the_answer_has_begun, daemon=True)
    canceller.start()
    result = run_claimed(claimed, cancel, renew_lease=False)
    canceller.join(timeout=10)

    # The worker raises the event for a lost lease or a passed handler deadline: a transient failure, retried.
    assert (result.outcome, result.error_class) == ("failed", "transient")
    assert "CanceledError" in result.error and "canceled after" in result.error
    (exchange,) = slow.exchanges
    wait_for(lambda: exchange.closed_at is not None, 15, "the caller to hang up")
    assert exchange.sent_steps < 30, "ended when the event was raised, not when the target finished (61 steps)"


# --- private targets (SSRF) -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/hook",
        "http://localhost:9/hook",
        "http://10.1.2.3/hook",
        "http://192.168.0.10/hook",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]:9/hook",
        "http://[::ffff:127.0.0.1]:9/hook",
        "http://0.0.0.0:9/hook",
    ],
)
def test_the_webhook_refuses_private_and_metadata_targets_by_default(settings, url):
    from dispatch.errors import PermanentError
    from dispatch.handlers.webhook import _checked_address

    settings.SCHEDULER_WEBHOOK_ALLOW_PRIVATE = False
    with pytest.raises(PermanentError, match="SCHEDULER_WEBHOOK_ALLOW_PRIVATE=1"):
        _checked_address(url)


def test_the_webhook_connects_to_the_address_it_checked_not_to_a_later_dns_answer(settings, monkeypatch):
    """DNS rebinding: the first answer (checked) is public, a later one private; the connection uses the first."""
    import socket as socket_module

    from dispatch.handlers import http_call
    from dispatch.handlers.http_call import Budget

    settings.SCHEDULER_WEBHOOK_ALLOW_PRIVATE = False
    answers = iter(
        [
            [(socket_module.AF_INET, socket_module.SOCK_STREAM, 6, "", ("93.184.216.34", 80))],
            [(socket_module.AF_INET, socket_module.SOCK_STREAM, 6, "", ("127.0.0.1", 80))],
        ]
    )
    monkeypatch.setattr(webhook_module.socket, "getaddrinfo", lambda *a, **k: next(answers))
    connected: list[tuple] = []

    class NoNetwork(socket_module.socket):
        def connect_ex(self, address):
            connected.append(address)
            return errno.ENETUNREACH

    monkeypatch.setattr(http_call.socket, "socket", NoNetwork)
    pinned = webhook_module._checked_address("http://rebinding.example/hook")
    with pytest.raises(OSError):
        http_call.request(
            scheme="http",
            host="rebinding.example",
            port=80,
            address=pinned,
            method="POST",
            target="/hook",
            body=b"{}",
            headers={},
            budget=Budget(1, threading.Event()),
            keep_body=0,
        )
    assert connected == [("93.184.216.34", 80)]
