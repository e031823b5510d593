"""The dashboard's refresh script (dispatch/static/dispatch/dashboard.js) under Node with a stub page and a hand-driven
clock: it fetches the page every 30 s while the tab is visible and swaps the dashboard and the health banner, waits
while the tab is hidden and catches up when it is shown, and stops while its checkbox is off."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "dispatch" / "static" / "dispatch" / "dashboard.js"

HARNESS = r"""
const fs = require("fs");
let clock = 0;
const timers = new Map();
let nextTimer = 1;
global.window = {
  fetch: true, DOMParser: true, location: { href: "http://localhost/admin/?lag=6h" },
  setTimeout: (fn, ms) => { const id = nextTimer++; timers.set(id, { at: clock + ms, fn }); return id; },
  clearTimeout: (id) => timers.delete(id),
};
Date.now = () => clock;
function advance(ms) {
  clock += ms;
  for (const [id, timer] of [...timers].sort((a, b) => a[1].at - b[1].at)) {
    if (timer.at <= clock) { timers.delete(id); timer.fn(); }
  }
}
function element(id, extra) {
  return Object.assign({ id, replaced: 0, getAttribute: (name) => (name === "data-refresh-seconds" ? "30" : null),
    replaceWith() { this.replaced += 1; }, remove() {} }, extra || {});
}
const page = { "ops-dash": element("ops-dash"), "console-health": element("console-health"),
  "ops-refresh": element("ops-refresh", { checked: true }), "ops-refresh-state": element("ops-refresh-state") };
const listeners = {};
global.document = {
  visibilityState: "visible",
  getElementById: (id) => page[id] || null,
  addEventListener: (type, listener) => (listeners[type] = listener),
  importNode: (node) => node,
};
const fetched = [];
global.fetch = (url, options) => {
  fetched.push({ url, credentials: options.credentials, at: clock });
  return Promise.resolve({ ok: true, text: () => Promise.resolve("<html>fresh</html>") });
};
global.DOMParser = function () {
  this.parseFromString = () => ({ getElementById: (id) => ({ id, fresh: true }) });
};
const seen = {};
const settle = () => new Promise((resolve) => setImmediate(resolve));
(async () => {
  eval(fs.readFileSync(process.argv[2], "utf8"));
  advance(29000);
  seen.before = fetched.length;
  advance(1000);
  await settle(); await settle(); await settle();
  seen.afterPeriod = fetched.map((f) => [f.url, f.credentials, f.at]);
  seen.swapped = [page["ops-dash"].replaced, page["console-health"].replaced];
  document.visibilityState = "hidden";
  listeners.visibilitychange();
  advance(120000);
  await settle();
  seen.whileHidden = fetched.length;
  document.visibilityState = "visible";
  listeners.visibilitychange();
  advance(0);
  await settle(); await settle(); await settle();
  seen.onShow = fetched.length;
  listeners.change({ target: { id: "ops-refresh", checked: false } });
  advance(300000);
  await settle();
  seen.paused = fetched.length;
  seen.state = page["ops-refresh-state"].textContent;
  console.log(JSON.stringify(seen));
})();
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js")
def test_the_dashboard_refreshes_every_30_s_while_visible_and_not_paused(tmp_path):
    harness = tmp_path / "harness.js"
    harness.write_text(HARNESS)

    done = subprocess.run(["node", str(harness), str(SCRIPT)], capture_output=True, text=True, timeout=30)

    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == 0
    assert seen["afterPeriod"] == [["http://localhost/admin/?lag=6h", "same-origin", 30000]], "the same page, as asked"
    assert seen["swapped"] == [1, 1], "the dashboard and the health banner"
    assert seen["whileHidden"] == 1, "nothing fetched while the tab is hidden"
    assert seen["onShow"] == 2, "caught up as soon as it is shown"
    assert (seen["paused"], seen["state"]) == (2, "paused")
