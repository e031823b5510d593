"""The dashboard's lag chart over a week or a range an operator types, read through that range's day partitions only;
its lines told apart by more than colour, a lane without data said so; and the page refreshing itself from a static
script (the Content-Security-Policy allows no inline one)."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from core.clock import db_now
from dispatch import dashboard
from dispatch.partitions import ensure_partitions
from scheduler_project import health
from tests.integration.test_console_dashboard import activity, lag_history  # noqa: F401 - fixtures

PARTITION = re.compile(r"dispatch_occurrence_p(\d{8})")


@pytest.fixture(autouse=True)
def _fresh_assessment():
    health.forget()
    yield
    health.forget()


@pytest.fixture
def partitions(db):
    """Day partitions from twelve days back to three ahead, so a read that is not pruned would show it."""
    today = db_now().date()
    ensure_partitions(connection, today - timedelta(days=12), today + timedelta(days=3))


def lag_read(client, query: str) -> tuple[str, datetime, datetime]:
    """The page's lag statement (the one with date_bin) and its bounds on scheduled_for."""
    with CaptureQueriesContext(connection) as queries:
        response = client.get(f"/admin/{query}")
    assert response.status_code == 200
    [sql] = [q["sql"] for q in queries.captured_queries if "date_bin(" in q["sql"]]
    since = re.search(r"o\.scheduled_for >= '([^']+)'", sql)
    until = re.search(r"o\.scheduled_for < '([^']+)'", sql)
    assert since and until, "both bounds are literals on the partition key"
    return sql, datetime.fromisoformat(since.group(1)), datetime.fromisoformat(until.group(1))


def partitions_read(sql: str) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}")
        plan = cursor.fetchone()[0]
    return set(PARTITION.findall(json.dumps(plan if isinstance(plan, list) else json.loads(plan))))


def test_the_week_answers_and_reads_only_its_days_partitions(console, lag_history, partitions):  # noqa: F811
    sql, since, until = lag_read(console, "?lag=7d")

    assert timedelta(days=7) <= until - since <= timedelta(days=7, hours=2), "a week, from a bucket's start"
    assert until <= db_now()
    read = partitions_read(sql)
    wanted = {f"{since + timedelta(days=n):%Y%m%d}" for n in range((until.date() - since.date()).days + 1)}
    assert read and read <= wanted, f"only the week's days: {sorted(read - wanted)}"
    dash = dashboard.build(lag=dashboard.lag_window("7d"))
    assert len(dash.lag_buckets) == 85 and dash.lag_buckets[1] - dash.lag_buckets[0] == timedelta(hours=2)


def test_a_typed_range_is_read_through_its_own_days_and_bounded_to_a_week(console, lag_history, partitions):  # noqa: F811
    now = db_now().replace(second=0, microsecond=0)
    grid = now - timedelta(minutes=now.minute % 15)
    start, end = grid - timedelta(hours=22), grid - timedelta(hours=2)
    query = f"?lag_from={start:%Y-%m-%d+%H:%M}&lag_to={end:%Y-%m-%d+%H:%M}"

    sql, since, until = lag_read(console, query)

    assert (since, until) == (start, end), "on the 15-minute grid already"
    assert partitions_read(sql) <= {f"{start:%Y%m%d}", f"{end:%Y%m%d}"}
    page = console.get(f"/admin/{query}").content.decode()
    assert f"Enqueue lag per lane, {start:%Y-%m-%d %H:%M} UTC to {end:%Y-%m-%d %H:%M} UTC" in page
    window = dashboard.custom_lag_window(start, end, now=now)
    assert (window.bucket_minutes, window.label_every) == (15, 16), "80 points, a label every 4 hours"
    dash = dashboard.build(lag=window)
    assert max(p for p in dash.lag["strict"]["p99"] if p is not None) == pytest.approx(7.0), "the fire 20 h ago"

    too_long = f"?lag_from={now - timedelta(days=8):%Y-%m-%d}&lag_to={now:%Y-%m-%d+%H:%M}"
    refused = console.get(f"/admin/{too_long}").content.decode()
    assert "Range ignored: a range spans at most 7 days; showing the last hour." in refused
    assert "Enqueue lag per lane, last hour" in refused
    assert "Range ignored: " in console.get("/admin/?lag_from=yesterday").content.decode()


def test_the_lag_lines_differ_in_dash_as_well_as_colour_and_a_lane_without_data_says_so(console, activity):  # noqa: F811
    dash = dashboard.build()
    series = dash.lag_series()

    assert list(series) == ["strict", "flexible"], "every lane, with data or without"
    for lines in series.values():
        assert [line.name for line in lines] == ["p50", "p95", "p99"]
        assert len({line.color for line in lines}) == 3 and len({line.dash for line in lines}) == 3
    assert all(line.has_data for line in series["strict"]) and not any(line.has_data for line in series["flexible"])
    panels = {panel["lane"]: panel for panel in dash.lag_panels()}
    assert "flexible lane: no data in this range" in panels["flexible"]["chart"]
    svg = str(panels["strict"]["chart"])
    legend_y = [float(y) for y in re.findall(r'<text x="[\d.]+" y="([\d.]+)" class="legend', svg)]
    plot_top = min(float(y) for y in re.findall(r'<line x1="44" y1="([\d.]+)"', svg))
    assert len(legend_y) == 3 and max(legend_y) < plot_top, "the legend sits above the plot, not over it"
    assert svg.count("stroke-dasharray") >= 4, "the dashed quantiles, in the lines and in the legend"

    page = console.get("/admin/").content.decode()
    assert "flexible lane: no data in this range" in page


def test_the_dashboard_refreshes_itself_from_a_static_script_and_has_no_inline_script_or_style(console, activity):  # noqa: F811
    page = console.get("/admin/").content.decode()

    assert '<script src="/static/dispatch/dashboard.js" defer></script>' in page
    assert all("src=" in tag for tag in re.findall(r"<script[^>]*>", page)), "no inline script"
    ours = page.split('id="console-health"', 1)[1].split("</section>", 1)[0]
    assert ' style="' not in ours, "no style attribute in the banner or the dashboard"
    assert 'data-refresh-seconds="30"' in ours and 'id="ops-refresh"' in ours


def test_a_custom_window_keeps_its_chart_to_a_hundred_points_and_eight_labels():
    now = datetime(2026, 12, 6, 4, 10, tzinfo=UTC)
    for span, bucket, spacing in (
        (timedelta(minutes=45), 1, 10),
        (timedelta(hours=6), 5, 60),
        (timedelta(days=2), 30, 360),
        (timedelta(days=7), 120, 1440),
    ):
        window = dashboard.custom_lag_window(now - span, now, now=now)
        assert (window.bucket_minutes, window.bucket_minutes * window.label_every) == (bucket, spacing), span
    with pytest.raises(ValueError, match="at most 7 days"):
        dashboard.custom_lag_window(now - timedelta(days=7, minutes=1), now, now=now)
    with pytest.raises(ValueError, match="before now"):
        dashboard.custom_lag_window(now + timedelta(hours=1), now + timedelta(hours=2), now=now)
