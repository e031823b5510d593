"""Playwright driving the system's Chromium (`make test` installs it) against a live console on `localhost`."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

# Playwright's sync API runs an event loop on the test's thread; the ORM calls the tests make between browser steps
# are still plain synchronous code, which Django would otherwise refuse there.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu"]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "img"


def chromium_path() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("Chromium is not installed: `make test` installs it (apt-get install chromium).")
    return path


@pytest.fixture(scope="session")
def browser() -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


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
    try:
        yield page
    finally:
        context.close()
    assert outside == [], f"the console loaded {outside} from outside the machine"
