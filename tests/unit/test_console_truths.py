"""Pure parts of the console's at-a-glance truths: the health banner's words for each problem /healthz reports, what
was down when a fire was missed (only what the heartbeat rows prove), and charts whose lines and empty series say
themselves."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

from dispatch.charts import NO_DATA, Series, line_chart
from dispatch.models import Occurrence
from dispatch.outages import ProcessSpan, silences
from scheduler_project.health import Engine, duration_words, engine_problems

DUE = datetime(2026, 12, 6, 4, 0, tzinfo=UTC)
TTL = 30.0


def test_each_engine_problem_has_healthzs_reason_and_the_banners_sentence():
    fields, problems = engine_problems(
        Engine(0, 0, 150.0, materializer_age=123.0, relay_age=None, outbox_wait=75.0), ttl=TTL, limit=60.0
    )

    assert fields == {"materializer": "silent", "relay": "silent", "materialization": "behind"}
    assert [p.reason for p in problems] == [
        "no materializer wrote a heartbeat in the last 30 s",
        "no relay wrote a heartbeat in the last 30 s",
        "the earliest active cursor is 150 s behind now (limit 60 s)",
        "the oldest due envelope has waited 75 s to be published (limit 60 s)",
    ]
    assert [p.words.split(":")[0] for p in problems] == [
        "No materializer has reported for 2 min",
        "Relay down. No relay is running (none has a heartbeat on record)",
        "Planning is 2 min behind (limit 60 s)",
        "Outbox backlog",
    ]
    assert engine_problems(Engine(1, 2, 3.0, 1.0, 1.0, 2.0), ttl=TTL, limit=60.0)[1] == []
    assert [duration_words(s) for s in (45, 119, 120, 7199, 7200, 200000)] == [
        "45 s",
        "119 s",
        "2 min",
        "119 min",
        "2 h",
        "2 d",
    ]


def missed(*, judged_after: float, planned: bool = True) -> Occurrence:
    judged = DUE + timedelta(seconds=judged_after)
    return Occurrence(
        occurrence_id=uuid.uuid4(),
        scheduled_for=DUE,
        available_at=DUE,
        state="missed",
        created_at=judged if planned else DUE - timedelta(seconds=30),
        finished_at=judged,
    )


def span(role: str, name: str, started: float, last: float) -> ProcessSpan:
    return ProcessSpan(role, name, DUE + timedelta(seconds=started), DUE + timedelta(seconds=last))


def test_a_silence_is_told_only_when_its_start_is_on_record_and_nothing_covered_the_fire():
    old, new = span("materializer", "m-old", -3600, -100), span("materializer", "m-new", 300, 900)

    [silence] = silences(missed(judged_after=302), [old, new], ttl=TTL)
    assert (silence.role, silence.seconds, silence.last.name, silence.resumed.name) == (
        "materializer",
        400,
        "m-old",
        "m-new",
    )
    assert silences(missed(judged_after=302), [new], ttl=TTL) == [], "no row before it: the start is not known"
    covering = span("materializer", "m-busy", -600, 900)
    assert silences(missed(judged_after=302), [old, new, covering], ttl=TTL) == [], "one was reporting"
    recent = span("materializer", "m-blip", -3600, -10)
    assert silences(missed(judged_after=302), [recent, span("materializer", "m-back", 15, 900)], ttl=TTL) == []
    # Judged by the materializer at planning: a silent relay had nothing to do with it.
    assert silences(missed(judged_after=302), [old, new, span("relay", "r-old", -3600, -500)], ttl=TTL)[0].role == (
        "materializer"
    )


def test_a_fire_missed_at_its_claim_names_the_silent_relay():
    relay = span("relay", "r-old", -3600, -200)
    found = silences(missed(judged_after=700, planned=False), [relay, span("materializer", "m", -3600, 900)], ttl=TTL)

    assert [(s.role, s.seconds, s.resumed) for s in found] == [("relay", 900, None)], "until it was judged"


def test_a_line_chart_keeps_its_legend_above_the_plot_and_names_a_series_without_data():
    instants = [DUE + timedelta(minutes=n) for n in range(61)]
    chart = str(
        line_chart(
            [Series("p50", "#0072B2", [0.1] * 61), Series("p99", "#D55E00", [None] * 61, "2 2")],
            instants,
            unit="s",
            empty="nothing",
            title="lag",
        )
    )

    assert f"p99: {NO_DATA}" in chart and 'class="legend no-data"' in chart
    legend = [float(y) for y in re.findall(r'y="([\d.]+)" class="legend', chart)]
    grid = [float(y) for y in re.findall(r'<line x1="44" y1="([\d.]+)"', chart)]
    assert max(legend) < min(grid)
    assert 'stroke-dasharray="2 2"' in chart, "the legend key shows the dash too"
    assert str(
        line_chart([Series("p50", "#0072B2", [None] * 61)], instants, unit="s", empty="nothing", title="lag")
    ) == ('<p class="chart-empty">nothing</p>')
