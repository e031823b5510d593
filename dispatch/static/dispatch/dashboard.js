// The dashboard refreshes itself (templates/admin/dispatch/dashboard.html): every data-refresh-seconds it fetches the
// page again and swaps the dashboard section and the health banner for the new ones, the rest of the page untouched.
// It waits while the tab is hidden (no polling nobody reads) and catches up as soon as it is shown again; the
// checkbox pauses it. A file of its own: the console's Content-Security-Policy allows no inline script.
(function () {
  "use strict";

  var SWAPPED = ["ops-dash", "console-health"];
  var section = document.getElementById("ops-dash");
  if (!section || !window.fetch || !window.DOMParser) {
    return;
  }
  var period = (parseInt(section.getAttribute("data-refresh-seconds"), 10) || 30) * 1000;
  var paused = false;
  var busy = false;
  var last = Date.now();
  var timer = null;

  function say(text, failed) {
    var state = document.getElementById("ops-refresh-state");
    if (state) {
      state.textContent = text;
      state.className = "refresh-state" + (failed ? " failed" : "");
    }
  }

  function swap(page) {
    SWAPPED.forEach(function (id) {
      var fresh = page.getElementById(id);
      var current = document.getElementById(id);
      if (fresh && current) {
        current.replaceWith(document.importNode(fresh, true));
      } else if (current && !fresh) {
        current.remove();
      } else if (fresh && id === "console-health") {
        // A banner that was not there before goes where the page puts it: above the content.
        var content = document.getElementById("content");
        if (content) {
          content.parentNode.insertBefore(document.importNode(fresh, true), content);
        }
      }
    });
    var box = document.getElementById("ops-refresh");
    if (box) {
      box.checked = !paused;
    }
  }

  function refresh() {
    if (busy || paused || document.visibilityState === "hidden") {
      return;
    }
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("HTTP " + response.status);
        }
        return response.text();
      })
      .then(function (html) {
        var page = new DOMParser().parseFromString(html, "text/html");
        if (!page.getElementById("ops-dash")) {
          // Signed out meanwhile (the login page came back): keep the figures and say so.
          throw new Error("signed out?");
        }
        swap(page);
        last = Date.now();
      })
      .catch(function (error) {
        say("refresh failed (" + error.message + "); the figures above may be old", true);
      })
      .then(function () {
        busy = false;
        schedule();
      });
  }

  function schedule() {
    window.clearTimeout(timer);
    if (paused || document.visibilityState === "hidden") {
      return;
    }
    timer = window.setTimeout(refresh, Math.max(0, period - (Date.now() - last)));
  }

  document.addEventListener("visibilitychange", schedule);
  document.addEventListener("change", function (event) {
    if (event.target && event.target.id === "ops-refresh") {
      paused = !event.target.checked;
      say(paused ? "paused" : "", false);
      schedule();
    }
  });
  schedule();
})();
