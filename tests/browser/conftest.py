"""Playwright driving the system's Chromium (`make test-long` installs it) against a live console on `localhost`."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "img"


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("Chromium is not installed: `make test-long` installs it (apt-get install chromium).")
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator:
    """Module-scoped: Playwright's sync API keeps an event loop running on this thread while it is open, and later
    tests that call asyncio.run() (the relay's) must not find it. The ORM calls these tests make between browser
    steps are plain synchronous code, which Django would refuse under that loop without DJANGO_ALLOW_ASYNC_UNSAFE."""
    from playwright.sync_api import sync_playwright

    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
            try:
                yield browser
            finally:
                browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser) -> Iterator:
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, offline=False)
    page = context.new_page()
    # The console must work offline: any request that leaves this machine fails the test.
    outside: list[str] = []
    page.on(
        "request",
        lambda request: (
            outside.append(request.url) if not request.url.startswith(("http://localhost", "data:", "about:")) else None
        ),
    )
    # Nor may anything the pages do be refused by their Content-Security-Policy (a console that quietly lost a
    # script or a style would pass every other check).
    refused: list[str] = []
    page.on(
        "console",
        lambda message: refused.append(message.text) if "Content Security Policy" in message.text else None,
    )
    try:
        yield page
    finally:
        context.close()
    assert outside == [], f"the console loaded {outside} from outside the machine"
    assert refused == [], f"the Content-Security-Policy refused: {refused}"


def an_hour_of_fires(make_occurrence, heartbeat, report, now, *, dead_reason: str) -> tuple:
    """What `make demo` shows after a while: a succeeded fire each minute of the last hour (with a small lag), one
    missed fire and one dead one of `report`. Returns (missed, dead)."""
    for minutes_ago in range(1, 55):
        at = now - timedelta(minutes=minutes_ago)
        lag = 0.04 + (minutes_ago % 7) * 0.01
        make_occurrence(heartbeat, at=at, state="succeeded", enqueued_at=at + timedelta(seconds=lag))
    missed_at = now - timedelta(minutes=30)
    missed = make_occurrence(
        report,
        at=missed_at,
        state="missed",
        finished_at=missed_at + timedelta(seconds=700),
        state_reason="late by 700 s > max lateness 60 s (skip)",
    )
    dead_at = now - timedelta(minutes=20)
    dead = make_occurrence(
        report,
        at=dead_at,
        state="dead",
        enqueued_at=dead_at + timedelta(seconds=1),
        finished_at=dead_at + timedelta(seconds=2),
        attempt_count=5,
        state_reason=dead_reason,
    )
    return missed, dead
