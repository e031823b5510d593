"""A stall at a glance, in Chromium: the health banner names it on the dashboard and on other console pages, and
the dashboard's own refresh (a static script the Content-Security-Policy allows) turns it back to healthy once
the materializer reports again."""

from __future__ import annotations

from datetime import timedelta

import pytest

from core.clock import db_now
from dispatch.models import ProcessHeartbeat
from scheduler_project import health
from tests.browser.test_operator_console import demo_like, log_in  # noqa: F401 - demo_like is a fixture

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.django_db(transaction=True)]


def test_a_stalled_materializer_is_a_banner_that_the_refresh_clears(page, live_server, demo_like):  # noqa: F811
    ProcessHeartbeat.objects.filter(role="materializer").update(heartbeat_at=db_now() - timedelta(seconds=125))
    health.forget()
    page.clock.install()
    errors = log_in(page, live_server)

    banner = page.locator("#console-health")
    assert "No materializer has reported for 2 min: fires are not being planned." in banner.inner_text()
    assert "health-degraded" in (banner.get_attribute("class") or "")
    page.click("#content-main a:text-is('Occurrences')")
    page.wait_for_load_state()
    assert "No materializer has reported for 2 min" in page.locator("#console-health").inner_text()

    page.goto(f"{live_server.url}/admin/")
    ProcessHeartbeat.objects.filter(role="materializer").update(heartbeat_at=db_now())
    with page.expect_response(lambda response: response.url == f"{live_server.url}/admin/"):
        page.clock.run_for(31_000)
    page.wait_for_selector("#console-health.health-ok")
    assert "Healthy" in page.locator("#console-health").inner_text()
    assert page.locator("svg.chart").count() == 3, "the dashboard swapped in whole: lag, states, due"
    assert errors == []
