/* Live preview on a schedule's change and add pages: the next fires of the rule as typed, with DST notes.
 *
 * Posts the form's time fields as JSON to the console's preview URL (the API's preview rules, see
 * schedules/admin/preview.py) a moment after each keystroke; on the add page, with the tenant chosen. Served from this app's static folder: the console
 * loads nothing from another host, so it works offline. Server text is inserted with textContent only.
 * The interval fields (every_seconds, anchor_at) are shown only while the kind is "interval", the DST policy
 * (dst_gap, dst_repeat) only while it is "cron".
 */
"use strict";

(function () {
  const DEBOUNCE_MS = 300;
  const COUNT = 10;
  const TEXT_FIELDS = ["kind", "cron", "timezone", "lane", "misfire_policy"];
  const INTEGER_FIELDS = ["flexible_window_seconds", "priority", "max_lateness_seconds", "catchup_limit", "max_runs"];
  // Each kind's own fields: shown for that kind only (the form drops another kind's on save).
  const KIND_FIELDS = { interval: ["every_seconds", "anchor_at"], cron: ["dst_gap", "dst_repeat"] };

  function field(form, name) {
    const element = form.elements.namedItem(name);
    return element && "value" in element ? element.value : null;
  }

  function definition(form) {
    const body = { count: COUNT };
    for (const name of TEXT_FIELDS) {
      const value = field(form, name);
      if (value !== null) body[name] = value;
    }
    for (const name of INTEGER_FIELDS) {
      const value = field(form, name);
      if (value === null || value.trim() === "") continue;
      // Not a whole number: sent as typed, so the answer is the API's own message for it.
      body[name] = /^-?\d+$/.test(value.trim()) ? parseInt(value.trim(), 10) : value;
    }
    if (body.kind === "once") {
      delete body.cron;
      body.run_at = instant(form, "run_at");
    } else if (body.kind === "interval") {
      delete body.cron;
      body.run_at = null;
      const every = (field(form, "every_seconds") || "").trim();
      // Not a whole number: sent as typed, so the answer is the API's own message for it.
      body.every_seconds = every === "" ? null : /^-?\d+$/.test(every) ? parseInt(every, 10) : every;
      body.anchor_at = instant(form, "anchor_at");
    } else {
      body.run_at = null;
      // An empty choice is the default policy, which the API spells null.
      for (const name of KIND_FIELDS.cron) body[name] = field(form, name) || null;
    }
    // Every kind's window; an empty one is unbounded (null).
    body.start_at = instant(form, "start_at");
    body.end_at = instant(form, "end_at");
    // Comma-separated calendar names; none is null.
    const calendars = (field(form, "exclude_calendars") || "").split(",").map((name) => name.trim()).filter(Boolean);
    body.exclude_calendars = calendars.length ? calendars : null;
    return body;
  }

  // A split date and time input of the form as an instant; the form labels these fields UTC.
  function instant(form, name) {
    const day = (field(form, name + "_0") || "").trim();
    const time = (field(form, name + "_1") || "").trim() || "00:00";
    return day ? day + "T" + time + "Z" : null;
  }

  // A kind's own fields mean nothing to another kind (the form drops them on save): shown for that kind only.
  function showKindFields(form) {
    const kind = field(form, "kind");
    if (kind === null) return; // a read-only page (a canceled schedule) shows what is stored
    for (const [owner, names] of Object.entries(KIND_FIELDS)) {
      for (const name of names) {
        for (const row of form.querySelectorAll(".field-" + name)) row.hidden = kind !== owner;
      }
    }
  }

  function element(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined) node.textContent = text;
    if (className) node.className = className;
    return node;
  }

  function renderErrors(target, errors) {
    const list = element("ul", undefined, "errorlist");
    for (const [name, messages] of Object.entries(errors)) {
      for (const message of [].concat(messages)) {
        list.appendChild(element("li", (name === "detail" ? "" : name + ": ") + message));
      }
    }
    target.replaceChildren(element("p", "This definition would be refused:", "help"), list);
  }

  function renderFires(target, data) {
    const nodes = [element("p", data.summary, "preview-summary")];
    if (data.notes.length) {
      const notes = element("ul", undefined, "dst-notes");
      for (const note of data.notes) notes.appendChild(element("li", note.text, "dst-" + note.kind));
      nodes.push(notes);
    }
    const ahead = element("ul", undefined, "dst-notes dst-ahead");
    for (const note of data.ahead) ahead.appendChild(element("li", "Later: " + note.text, "dst-" + note.kind));
    if (!data.fires.length) {
      nodes.push(element("p", data.empty, "help"));
      if (data.ahead.length) nodes.push(ahead);
      target.replaceChildren(...nodes);
      return;
    }
    const table = element("table");
    table.style.width = "100%";
    const head = element("tr");
    for (const title of ["#", "UTC", "Local", "Clock change"]) head.appendChild(element("th", title));
    table.appendChild(element("thead")).appendChild(head);
    const rows = table.appendChild(element("tbody"));
    data.fires.forEach(function (fire, index) {
      const row = element("tr");
      for (const text of [String(index + 1), fire.utc_text, fire.local_text, fire.note]) {
        row.appendChild(element("td", text));
      }
      rows.appendChild(row);
    });
    nodes.push(table);
    if (data.ahead.length) nodes.push(ahead);
    target.replaceChildren(...nodes);
  }

  // The add page's tenant select decides whose calendars the preview reads; a stored schedule's URL names its own.
  function previewUrl(panel, form) {
    const tenant = field(form, "tenant");
    if (tenant === null) return panel.dataset.previewUrl;
    const url = new URL(panel.dataset.previewUrl, window.location.href);
    if (tenant) url.searchParams.set("tenant", tenant);
    else url.searchParams.delete("tenant");
    return url.pathname + url.search;
  }

  function start(panel) {
    const form = document.getElementById("schedule_form");
    const target = panel.querySelector(".live-preview-body");
    if (!form || !target) return;
    const token = form.elements.namedItem("csrfmiddlewaretoken");
    let timer = null;
    let sequence = 0;
    let inFlight = null;

    async function refresh() {
      const mine = ++sequence;
      if (inFlight) inFlight.abort();
      inFlight = new AbortController();
      try {
        const response = await fetch(previewUrl(panel, form), {
          method: "POST",
          credentials: "same-origin",
          headers: { "Content-Type": "application/json", "X-CSRFToken": token ? token.value : "" },
          body: JSON.stringify(definition(form)),
          signal: inFlight.signal,
        });
        if (mine !== sequence) return; // a later keystroke has its own request
        const type = response.headers.get("Content-Type") || "";
        if (!type.includes("application/json")) {
          target.replaceChildren(element("p", "Preview unavailable (signed out?): reload the page.", "help"));
          return;
        }
        const data = await response.json();
        if (response.ok) renderFires(target, data);
        else renderErrors(target, data);
      } catch (error) {
        if (error.name !== "AbortError" && mine === sequence) {
          target.replaceChildren(element("p", "Preview unavailable: " + error.message, "help"));
        }
      }
    }

    function schedule() {
      clearTimeout(timer);
      timer = setTimeout(refresh, DEBOUNCE_MS);
    }

    form.addEventListener("input", schedule);
    form.addEventListener("change", schedule);
    refresh();
  }

  document.addEventListener("DOMContentLoaded", function () {
    const form = document.getElementById("schedule_form");
    if (form) {
      showKindFields(form);
      form.addEventListener("change", function () {
        showKindFields(form);
      });
    }
    const panel = document.getElementById("live-preview");
    if (panel) start(panel);
  });
})();
