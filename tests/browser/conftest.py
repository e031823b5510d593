"""Playwright driving the system's Chromium (`make test-long` installs it) against a live console on `localhost`."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
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
