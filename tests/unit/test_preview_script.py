"""The change form's script (schedules/static/schedules/js/preview.js) under Node with a stub page: the interval fields
and the cron DST policy are shown for their kind only, and the live preview posts them as the API takes them."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "schedules" / "static" / "schedules" / "js" / "preview.js"

# A page with just what the script touches: the form's fields by name, the rows of the interval fields, the preview
# panel, fetch. It loads the script, switches the kind from cron to interval, and prints what it saw.
HARNESS = r"""
const fs = require("fs");
const values = {
  kind: "cron", cron: "* * * * *", timezone: "UTC", lane: "strict", misfire_policy: "skip",
  dst_gap: "shift", dst_repeat: "", exclude_calendars: " us-holidays, ,maintenance ",
  every_seconds: " 90 ", anchor_at_0: "2026-01-01", anchor_at_1: "00:00:05", run_at_0: "", run_at_1: "",
  csrfmiddlewaretoken: "token",
};
const rows = {
  every_seconds: [{ hidden: false }], anchor_at: [{ hidden: false }],
  dst_gap: [{ hidden: false }], dst_repeat: [{ hidden: false }],
};
const formListeners = {};
const form = {
  elements: { namedItem: (name) => (name in values ? { value: values[name] } : null) },
  querySelectorAll: (selector) => rows[selector.replace(".field-", "")] || [],
  addEventListener: (type, listener) => (formListeners[type] = formListeners[type] || []).push(listener),
};
const sent = [];
global.fetch = async (url, options) => {
  sent.push(JSON.parse(options.body));
  return {
    ok: true,
    headers: { get: () => "application/json" },
    json: async () => ({ summary: "", notes: [], ahead: [], fires: [], empty: "" }),
  };
};
const panel = { dataset: { previewUrl: "/preview/" }, querySelector: () => ({ replaceChildren: () => {} }) };
const pageListeners = {};
global.document = {
  addEventListener: (type, listener) => (pageListeners[type] = listener),
  getElementById: (id) => ({ schedule_form: form, "live-preview": panel })[id] || null,
  createElement: () => ({ appendChild: (child) => child, style: {} }),
};
const seen = {};
const shown = () => ["every_seconds", "anchor_at", "dst_gap", "dst_repeat"].map((name) => rows[name][0].hidden);
eval(fs.readFileSync(process.argv[2], "utf8"));
pageListeners.DOMContentLoaded();
seen.hiddenForCron = shown();
values.kind = "interval";
for (const listener of formListeners.change) listener();
seen.hiddenForInterval = shown();
setTimeout(() => {
  seen.sent = sent;
  console.log(JSON.stringify(seen));
}, 600);
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_the_change_form_shows_interval_fields_for_that_kind_and_previews_them(tmp_path):
    harness = tmp_path / "harness.js"
    harness.write_text(HARNESS)

    done = subprocess.run(["node", str(harness), str(SCRIPT)], capture_output=True, text=True, timeout=30)

    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["hiddenForCron"] == [True, True, False, False]
    assert seen["hiddenForInterval"] == [False, False, True, True]
    cron, interval = seen["sent"]
    assert cron["kind"] == "cron" and "every_seconds" not in cron and "anchor_at" not in cron
    assert (cron["dst_gap"], cron["dst_repeat"]) == ("shift", None), "an empty choice is the default, null"
    assert cron["exclude_calendars"] == ["us-holidays", "maintenance"], "comma-separated names, blanks dropped"
    assert interval == {
        "count": 10,
        "kind": "interval",
        "timezone": "UTC",
        "lane": "strict",
        "misfire_policy": "skip",
        "run_at": None,
        "every_seconds": 90,
        "anchor_at": "2026-01-01T00:00:05Z",
        "start_at": None,
        "end_at": None,
        "exclude_calendars": ["us-holidays", "maintenance"],
    }
