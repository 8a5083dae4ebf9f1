// tally's web dashboard: a single page over the public HTTP API (SPEC §3) and nothing else.
//
// The whole view lives in the URL's fragment (`#/key/clicks/lnk_1?range=24h&tz=UTC`), so a
// view can be shared and reloaded. Every number on screen is one the API answered: buckets
// are drawn as the series/dashboard query returns them (a DST day has 23 or 25 hours because
// the API says so), and an API error is shown with its own message. The DOM is built from
// text nodes only (keys and dimension values are user data), and nothing runs inline, so the
// server's Content-Security-Policy can forbid it. Elements that carry a number have a
// `data-testid` for the browser test in crates/cli/tests/cli/dashboard.rs.
"use strict";

(() => {
  const SVG_NS = "http://www.w3.org/2000/svg";
  const TOKEN_KEY = "tally.token";
  const numbers = new Intl.NumberFormat();
  const browserZone = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";

  /** Range presets: the unit each draws its timeline in unless the URL names one. */
  const PRESETS = [
    { id: "1h", label: "Last hour", secs: 3600, unit: "minute" },
    { id: "24h", label: "Last 24 h", secs: 86400, unit: "hour" },
    { id: "7d", label: "Last 7 d", secs: 7 * 86400, unit: "hour" },
    { id: "30d", label: "Last 30 d", secs: 30 * 86400, unit: "day" },
    { id: "month", label: "This month", secs: 0, unit: "day" },
  ];
  const UNITS = ["minute", "hour", "day", "week", "mweek", "month", "quarter", "year"];
  const REFRESH = [["", "Off"], ["10", "10 s"], ["30", "30 s"], ["60", "1 min"], ["300", "5 min"]];
  const WINDOWS = [["1m", "Last minute"], ["1h", "Last hour"], ["1d", "Last day"]];
  /** The parameters that make up a range: carried along from page to page. */
  const RANGE_PARAMS = ["range", "from", "to", "unit", "tz", "refresh"];

  let generation = 0;
  let refreshTimer = null;

  // ---- DOM helpers ----------------------------------------------------------------------

  function build(el, attrs, children) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }
  const h = (tag, attrs, ...children) => build(document.createElement(tag), attrs, children);
  const s = (tag, attrs, ...children) => build(document.createElementNS(SVG_NS, tag), attrs, children);
  /** A count as the page shows it. JSON numbers become doubles here, exact only up to 2^53:
   *  a count beyond (counters are 64-bit) may have lost its last digits, and says so. */
  const num = (n) => (Number.isSafeInteger(n) || !Number.isInteger(n) ? "" : "≈") + numbers.format(n);

  function loading(what) {
    return h("p", { class: "state", role: "status", "aria-busy": "true" }, `Loading ${what}…`);
  }

  /** An API error as the API gave it: code and message, and what a 401/403 means here. */
  function errorBox(err) {
    const hint =
      err.status === 403 ? " (this token's scopes do not cover it)" :
      err.code === "no_tier_for_range" ? " (no tier of this namespace covers the range at this unit: pick a shorter range or a coarser unit)" :
      "";
    return h("div", { class: "error", role: "alert" },
      h("strong", {}, err.status ? `${err.status} ${err.code}` : err.code), ": ",
      h("span", { "data-testid": "error", "data-code": err.code }, err.message), hint);
  }

  // ---- the API --------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  function token() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ""; } catch { return ""; }
  }

  const given = (params) =>
    Object.entries(params || {}).filter(([, v]) => v !== "" && v !== null && v !== undefined);

  /** GETs `path` with `params`, or POSTs `body` as JSON when there is one. */
  async function api(path, params, body) {
    const url = new URL(path, location.origin);
    for (const [k, v] of given(params)) url.searchParams.set(k, v);
    const headers = { Accept: "application/json" };
    const t = token();
    if (t) headers.Authorization = `Bearer ${t}`;
    const init = { headers, cache: "no-store" };
    if (body !== undefined) {
      init.method = "POST";
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(url, init);
    } catch (e) {
      throw new ApiError(0, "unreachable", `the server could not be reached (${e.message})`);
    }
    let answer = null;
    try { answer = await resp.json(); } catch { answer = null; }
    if (!resp.ok) {
      const e = (answer && answer.error) || {};
      throw new ApiError(resp.status, e.code || `http_${resp.status}`, e.message || resp.statusText);
    }
    return answer;
  }

  const keyPath = (ns, key) =>
    `/v1/ns/${encodeURIComponent(ns)}/keys/${encodeURIComponent(key)}`;

  /** One query of a key (`kind`: series, dashboard, window…). The keys `.` and `..` cannot
   *  be path segments (a URL drops dot segments, percent-encoded or not), so they are asked
   *  through `POST /v1/query`, which takes any key (SPEC §3). */
  async function keyApi(ns, key, kind, params) {
    if (key !== "." && key !== "..") return api(`${keyPath(ns, key)}/${kind}`, params);
    const q = { kind, ns, key, ...Object.fromEntries(given(params)) };
    const r = (await api("/v1/query", null, { queries: [q] })).results[0];
    if (r && r.error) {
      // An entry's error carries no status; these two change what the page does.
      const status = { unauthorized: 401, forbidden: 403 }[r.error.code] || 0;
      throw new ApiError(status, r.error.code, r.error.message);
    }
    return r;
  }

  // ---- routes and the view in the URL ---------------------------------------------------

  function parseRoute() {
    const raw = location.hash.replace(/^#/, "") || "/";
    const q = raw.indexOf("?");
    const path = q < 0 ? raw : raw.slice(0, q);
    const params = new URLSearchParams(q < 0 ? "" : raw.slice(q + 1));
    let parts;
    try {
      parts = path.split("/").filter(Boolean).map(decodeURIComponent);
    } catch {
      parts = ["bad"];
    }
    return { parts, params };
  }

  function link(parts, params) {
    const qs = params ? params.toString() : "";
    return "#/" + parts.map(encodeURIComponent).join("/") + (qs ? `?${qs}` : "");
  }

  function carry(params) {
    const out = new URLSearchParams();
    for (const k of RANGE_PARAMS) if (params.get(k)) out.set(k, params.get(k));
    return out;
  }

  /** The zone's UTC offset in seconds at `secs`, or null for a zone the browser lacks. */
  function offsetAt(zone, secs) {
    try {
      const parts = new Intl.DateTimeFormat("en-US", {
        timeZone: zone, hourCycle: "h23", year: "numeric", month: "numeric", day: "numeric",
        hour: "numeric", minute: "numeric", second: "numeric",
      }).formatToParts(new Date(secs * 1000));
      const p = Object.fromEntries(parts.map((x) => [x.type, Number(x.value)]));
      return Date.UTC(p.year, p.month - 1, p.day, p.hour, p.minute, p.second) / 1000 - secs;
    } catch {
      return null;
    }
  }

  /** Local midnight of the 1st of this month in `zone` (whatever the unit: an hourly
   *  timeline of the month starts there too), by the zone's offset at that midnight, not
   *  now's: a DST change may lie between. */
  function monthStart(zone, now) {
    const off = offsetAt(zone, now);
    if (off === null) return now;
    const local = new Date((now + off) * 1000);
    const wall = Date.UTC(local.getUTCFullYear(), local.getUTCMonth(), 1) / 1000;
    const then = offsetAt(zone, wall - off);
    return wall - (then === null ? off : then);
  }

  function viewOf(params) {
    const zone = params.get("tz") || browserZone;
    let range = params.get("range") || (params.get("from") ? "custom" : "24h");
    const preset = PRESETS.find((p) => p.id === range);
    if (!preset && range !== "custom") range = "24h";
    const now = Math.floor(Date.now() / 1000);
    let from, to;
    if (range === "custom") {
      from = params.get("from") || "";
      to = params.get("to") || "";
    } else if (range === "month") {
      from = String(monthStart(zone, now));
      to = String(now);
    } else {
      from = String(now - (preset || PRESETS[1]).secs);
      to = String(now);
    }
    const unit = params.get("unit") || (preset ? preset.unit : "hour");
    return { range, from, to, unit, tz: zone, refresh: params.get("refresh") || "" };
  }

  const rangeQuery = (v) => ({ from: v.from, to: v.to, unit: v.unit, tz: v.tz });

  /** The effective range an answer reports, as the API wrote it. */
  function effective(answer) {
    return h("p", { class: "range" },
      "From ", h("time", { datetime: answer.from_t, "data-testid": "from" }, answer.from_t),
      " to ", h("time", { datetime: answer.to_t, "data-testid": "to" }, answer.to_t),
      answer.resolution ? ` (read from the ${answer.resolution} tier)` : "");
  }

  // ---- controls -------------------------------------------------------------------------

  let zoneList = null;
  function zones() {
    if (!zoneList) {
      zoneList = h("datalist", { id: "zones" });
      let all = [];
      try { all = Intl.supportedValuesOf("timeZone"); } catch { all = []; }
      for (const z of new Set(["UTC", browserZone, ...all])) zoneList.append(h("option", { value: z }));
    }
    return zoneList;
  }

  /** The range form: a preset or a custom from/to, the unit, the zone, auto-refresh. */
  function controls(parts, params, v, withUnit) {
    const go = (next) => { location.hash = link(parts, next); };
    const form = h("form", { class: "controls", "aria-label": "range" });
    const field = (label, input) => h("label", {}, h("span", {}, label), input);
    const range = h("select", { name: "range" },
      PRESETS.map((p) => h("option", { value: p.id, selected: v.range === p.id }, p.label)),
      h("option", { value: "custom", selected: v.range === "custom" }, "Custom"));
    const from = h("input", { name: "from", value: v.range === "custom" ? v.from : "", placeholder: "RFC 3339 or unix s", size: 26 });
    const to = h("input", { name: "to", value: v.range === "custom" ? v.to : "", placeholder: "RFC 3339 or unix s", size: 26 });
    const unit = h("select", { name: "unit" },
      UNITS.map((u) => h("option", { value: u, selected: v.unit === u }, u)));
    const tz = h("input", { name: "tz", value: v.tz, list: "zones", size: 18, autocomplete: "off" });
    const refresh = h("select", { name: "refresh" },
      REFRESH.map(([val, label]) => h("option", { value: val, selected: v.refresh === val }, label)));
    // `custom`: the from/to fields make the range; `preset`: a preset was just picked, and
    // brings its own unit (a change of unit, zone or refresh keeps the unit chosen).
    const apply = (custom, preset) => {
      const next = new URLSearchParams(params);
      const rangeId = custom ? "custom" : range.value;
      next.set("range", rangeId);
      if (rangeId === "custom") {
        next.set("from", from.value.trim());
        next.set("to", to.value.trim());
      } else {
        next.delete("from");
        next.delete("to");
      }
      if (withUnit) next.set("unit", unit.value); else next.delete("unit");
      if (preset && withUnit) {
        const p = PRESETS.find((x) => x.id === rangeId);
        if (p) next.set("unit", p.unit);
      }
      next.set("tz", tz.value.trim() || browserZone);
      if (refresh.value) next.set("refresh", refresh.value); else next.delete("refresh");
      go(next);
    };
    range.addEventListener("change", () => {
      if (range.value === "custom") {
        from.value = from.value || form.dataset.from || "";
        to.value = to.value || form.dataset.to || "";
        from.focus();
      } else {
        apply(false, true);
      }
    });
    for (const sel of [unit, refresh]) sel.addEventListener("change", () => apply(range.value === "custom", false));
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      apply(range.value === "custom" || from.value.trim() !== "" || to.value.trim() !== "", false);
    });
    form.append(
      field("Range", range), field("From", from), field("To", to),
      withUnit ? field("Unit", unit) : null,
      field("Time zone", tz), zones(), field("Auto-refresh", refresh),
      h("button", { type: "submit" }, "Apply"));
    return form;
  }

  /** Lets the custom fields start from the range the last answer covered. */
  function remember(form, answer) {
    if (form && answer) {
      form.dataset.from = answer.from_t;
      form.dataset.to = answer.to_t;
    }
  }

  // ---- the overview ---------------------------------------------------------------------

  async function overview(page, params) {
    const v = viewOf(params);
    const form = controls([], params, v, true);
    page.append(h("h1", {}, "Namespaces"), form);
    const list = await api("/v1/ns");
    if (list.namespaces.length === 0) {
      page.append(h("p", { class: "state", "data-testid": "empty" },
        "No namespace you can read yet: send events to POST /v1/events."));
      return;
    }
    const grid = h("div", { class: "grid" });
    page.append(grid);
    const loads = list.namespaces.map((ns) => namespaceCard(grid, ns, params, v, form));
    // Each top is an exact scan of its namespace: the first few load by themselves, a few
    // at a time; the others when asked (their card's button).
    const queue = loads.slice(0, AUTO_TOP);
    for (const load of loads.slice(AUTO_TOP)) load.deferred();
    // (Asked no more once the page is left: its answers would go nowhere.)
    const gen = generation;
    await Promise.all(Array.from({ length: TOPS_AT_ONCE }, async () => {
      while (queue.length > 0 && gen === generation) await queue.shift()();
    }));
  }

  /** Namespaces whose top keys the overview asks for by itself, and how many at once. */
  const AUTO_TOP = 24;
  const TOPS_AT_ONCE = 4;

  /** A namespace's card; answers the function that loads its top keys (with `deferred`,
   *  which puts a button there instead). */
  function namespaceCard(grid, ns, params, v, form) {
    const body = h("div", {}, loading("top keys"));
    const load = () => namespaceTop(body, ns, params, v, form);
    load.deferred = () => {
      const button = h("button", { type: "button", "data-testid": "load-top" }, "Show top keys");
      button.addEventListener("click", () => {
        body.replaceChildren(loading("top keys"));
        load().catch((e) => {
          // A token that stopped working: the page asks for one, as everywhere.
          if (e.status === 401) render();
          else body.replaceChildren(errorBox(e));
        });
      });
      body.replaceChildren(button);
    };
    grid.append(h("section", { class: "card", "data-testid": "namespace", "data-ns": ns.name },
      h("h2", {}, ns.name),
      h("dl", { class: "schema" },
        h("dt", {}, "Tiers"), h("dd", {}, ns.tiers.join(", ")),
        h("dt", {}, "Breakdown tiers"), h("dd", {}, ns.breakdown_tiers.join(", ")),
        h("dt", {}, "Dimensions"), h("dd", {}, ns.dimensions ? ns.dimensions.join(", ") || "none" : "any")),
      h("p", {}, h("a", { href: link(["keys", ns.name], carry(params)) }, "Search keys")),
      body));
    return load;
  }

  async function namespaceTop(body, ns, params, v, form) {
    let top;
    try {
      top = await api(`/v1/ns/${encodeURIComponent(ns.name)}/top`, { ...rangeQuery(v), limit: 10 });
    } catch (e) {
      if (e.status === 401) throw e;
      body.replaceChildren(errorBox(e));
      return;
    }
    remember(form, top);
    if (top.keys.length === 0) {
      body.replaceChildren(effective(top),
        h("p", { class: "state", "data-testid": "empty" }, "No events in this namespace in this range."));
      return;
    }
    const rows = top.keys.map((k) => h("tr", {},
      h("td", {}, h("a", { href: link(["key", ns.name, k.key], carry(params)) }, k.key)),
      h("td", { class: "n", "data-testid": "top-n", "data-ns": ns.name, "data-key": k.key }, num(k.n))));
    body.replaceChildren(effective(top),
      h("table", { class: "topkeys" },
        h("caption", {}, "Top keys"),
        h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Key"), h("th", { scope: "col", class: "n" }, "Count"))),
        h("tbody", {}, rows),
        h("tfoot", {},
          h("tr", {}, h("th", { scope: "row" }, "Other keys"), h("td", { class: "n", "data-testid": "top-other" }, num(top.other))),
          h("tr", {}, h("th", { scope: "row" }, "Namespace total"), h("td", { class: "n", "data-testid": "ns-total", "data-ns": ns.name }, num(top.total))))));
  }

  // ---- a key ----------------------------------------------------------------------------

  async function keyPage(page, params, ns, key) {
    const v = viewOf(params);
    const form = controls(["key", ns, key], params, v, true);
    page.append(
      h("p", { class: "crumbs" }, h("a", { href: link([], carry(params)) }, "Overview"), " / ",
        h("a", { href: link(["keys", ns], carry(params)) }, ns)),
      h("h1", {}, h("span", { class: "muted" }, `${ns} / `), h("span", { "data-testid": "key" }, key)),
      form);
    const main = h("div", {}, loading("the key"));
    const windows = h("section", { class: "card", "aria-labelledby": "windows-h" },
      h("h2", { id: "windows-h" }, "Rolling windows"), loading("windows"));
    page.append(main, windows);
    await Promise.all([keyMain(main, form, ns, key, v), keyWindows(windows, ns, key)]);
  }

  async function keyMain(box, form, ns, key, v) {
    const q = { ...rangeQuery(v), limit: 10 };
    let dash = null;
    let dashErr = null;
    try {
      dash = await keyApi(ns, key, "dashboard", q);
    } catch (e) {
      if (e.status === 401) throw e;
      dashErr = e;
    }
    let series = dash;
    if (!dash) {
      // Breakdowns read only the breakdown tiers: the series may still have a tier.
      try {
        const sa = await keyApi(ns, key, "series", rangeQuery(v));
        series = { ...sa, timeline: sa.points };
      } catch (e) {
        if (e.status === 401) throw e;
        box.replaceChildren(errorBox(e));
        return;
      }
    }
    remember(form, series);
    const total = h("section", { class: "card total", "aria-labelledby": "total-h" },
      h("h2", { id: "total-h" }, "Total"),
      h("p", { class: "big", "data-testid": "total" }, num(series.total)),
      effective(series));
    const timeline = h("section", { class: "card", "aria-labelledby": "timeline-h" },
      h("h2", { id: "timeline-h" }, `Timeline by ${series.every > 1 ? `${series.every} ` : ""}${series.unit} (${series.tz})`));
    const breakdowns = h("section", { class: "card", "aria-labelledby": "breakdowns-h" },
      h("h2", { id: "breakdowns-h" }, "Breakdowns"));
    if (series.total === 0 && series.timeline.every((p) => p.n === 0)) {
      timeline.append(h("p", { class: "state", "data-testid": "empty" }, "No events for this key in this range."));
      box.replaceChildren(total, timeline);
      return;
    }
    timeline.append(chart(series));
    if (dashErr) {
      breakdowns.append(errorBox(dashErr));
    } else {
      const dims = Object.keys(dash.breakdowns).sort();
      if (dims.length === 0) breakdowns.append(h("p", { class: "state" }, "No dimension has a value in this range."));
      for (const d of dims) breakdowns.append(breakdown(dash.breakdowns[d]));
    }
    box.replaceChildren(total, timeline, breakdowns);
  }

  function barRow(label, n, max, attrs, cls) {
    const pct = max > 0 ? (100 * Math.abs(n)) / max : 0;
    return h("tr", { class: cls || null },
      h("th", { scope: "row" }, label),
      h("td", { class: "bar" }, s("svg", { viewBox: "0 0 100 10", preserveAspectRatio: "none", "aria-hidden": "true" },
        s("rect", { x: 0, y: 0, width: pct.toFixed(2), height: 10 }))),
      h("td", { class: "n", "data-testid": "breakdown-n", ...attrs }, num(n)));
  }

  function breakdown(b) {
    const max = Math.max(1, ...b.values.map((x) => Math.abs(x.n)), Math.abs(b.other), Math.abs(b.unset));
    return h("div", { class: "breakdown", "data-testid": "breakdown", "data-dim": b.dim },
      h("h3", {}, b.dim, b.dim.includes("+") ? h("span", { class: "muted" }, " (compound: parts joined by |)") : null),
      h("table", {},
        h("tbody", {},
          b.values.map((x) => barRow(x.value, x.n, max, { "data-dim": b.dim, "data-value": x.value })),
          barRow("other", b.other, max, { "data-dim": b.dim, "data-kind": "other" }, "muted"),
          barRow("unset", b.unset, max, { "data-dim": b.dim, "data-kind": "unset" }, "muted")),
        h("tfoot", {}, h("tr", {}, h("th", { scope: "row" }, "total"), h("td", {}),
          h("td", { class: "n", "data-testid": "breakdown-total", "data-dim": b.dim }, num(b.total))))));
  }

  /** A bucket's label from the API's own local time (`t`), never recomputed here; times of
   *  day carry their date (`MM-DD HH:MM`) when the timeline spans more than one day. */
  function bucketLabel(t, unit, manyDays) {
    const date = t.slice(0, 10);
    const time = t.slice(11, 16);
    if (unit === "second") return t.slice(11, 19);
    if (unit === "minute" || unit === "hour") return manyDays ? `${t.slice(5, 10)} ${time}` : time;
    if (unit === "month" || unit === "quarter") return t.slice(0, 7);
    if (unit === "year") return t.slice(0, 4);
    return date;
  }

  /** The most buckets drawn as bars: each is a few SVG nodes, and the API answers up to
   *  `max_points` (100 000 by default) — more than a browser lays out quickly, or than a
   *  chart 1 100 pixels wide can show. */
  const MAX_BARS = 2000;

  /** The timeline as SVG bars, one per bucket the API returned (or, past `MAX_BARS`, a
   *  note saying to pick a coarser unit: a bar is never a sum made here). */
  function chart(series) {
    const points = series.timeline;
    if (points.length > MAX_BARS) {
      return h("p", { class: "state", "data-testid": "too-many", "data-buckets": points.length },
        `${num(points.length)} buckets by ${series.unit}: too many to draw one bar each ` +
        `(at most ${num(MAX_BARS)}). Pick a coarser unit or a shorter range.`);
    }
    // Drawn at the width it will have, so its text keeps its size on a phone.
    const room = document.getElementById("main").clientWidth - 48;
    const W = Math.max(300, Math.min(1100, room || 800)), H = 240;
    const left = 56, right = 8, top = 10, bottom = 34;
    const plotW = W - left - right, plotH = H - top - bottom;
    // (A loop, not Math.max(...points): a call takes a bounded number of arguments.)
    let max = 1, min = 0;
    for (const p of points) {
      if (p.n > max) max = p.n;
      if (p.n < min) min = p.n;
    }
    const manyDays = points.length > 1 &&
      points[0].t.slice(0, 10) !== points[points.length - 1].t.slice(0, 10);
    const span = max - min;
    const y = (n) => top + plotH - ((n - min) / span) * plotH;
    const bw = plotW / Math.max(1, points.length);
    const svg = s("svg", {
      viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img", "data-testid": "chart",
      "aria-label": `${points.length} buckets by ${series.unit} in ${series.tz}, total ${num(series.total)}, highest ${num(max)}`,
    });
    svg.append(
      s("line", { x1: left, x2: W - right, y1: y(0), y2: y(0), class: "axis" }),
      s("line", { x1: left, x2: W - right, y1: y(max), y2: y(max), class: "gridline" }),
      s("text", { x: left - 6, y: y(max) + 4, class: "ylabel" }, num(max)),
      s("text", { x: left - 6, y: y(0) + 4, class: "ylabel" }, "0"));
    const ticks = Math.min(points.length, Math.max(3, Math.floor(W / 90)));
    const every = Math.max(1, Math.ceil(points.length / ticks));
    points.forEach((p, i) => {
      const x = left + i * bw;
      const y0 = y(Math.max(0, p.n)), y1 = y(Math.min(0, p.n));
      const label = bucketLabel(p.t, series.unit, manyDays);
      svg.append(s("rect", {
        x: (x + bw * 0.1).toFixed(2), width: Math.max(0.5, bw * 0.8).toFixed(2),
        y: y0.toFixed(2), height: Math.max(0, y1 - y0).toFixed(2),
        class: "bucket", "data-testid": "bucket", "data-t": p.t, "data-n": p.n, "data-label": label,
      }, s("title", {}, `${p.t}: ${num(p.n)}`)));
      if (i % every === 0) {
        svg.append(s("text", { x: (x + bw / 2).toFixed(2), y: H - bottom + 16, class: "xlabel" }, label));
      }
    });
    const figure = h("figure", { "data-chart": "" }, svg,
      h("figcaption", {}, `${num(points.length)} buckets; hover a bar for its time and count.`));
    drawn.set(figure, series);
    return figure;
  }

  /** Charts on screen and their series, to draw again at a new width without a request. */
  const drawn = new WeakMap();
  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      for (const fig of document.querySelectorAll("figure[data-chart]")) {
        const series = drawn.get(fig);
        if (series) fig.replaceWith(chart(series));
      }
    }, 200);
  });

  async function keyWindows(box, ns, key) {
    const cells = WINDOWS.map(([last, label]) => {
      const cell = h("div", { class: "window" }, h("h3", {}, label), loading(last));
      const done = keyApi(ns, key, "window", { last }).then(
        (w) => cell.replaceChildren(h("h3", {}, label),
          h("p", { class: "big", "data-testid": "window", "data-last": last }, num(w.n)),
          h("p", { class: "muted" }, `since ${w.from_t}, ${w.resolution} buckets`)),
        (e) => {
          if (e.status === 401) throw e;
          cell.replaceChildren(h("h3", {}, label), errorBox(e));
        });
      return { cell, done };
    });
    box.replaceChildren(box.firstChild, h("div", { class: "windows" }, cells.map((c) => c.cell)));
    await Promise.all(cells.map((c) => c.done));
  }

  // ---- key search -----------------------------------------------------------------------

  const PAGE = 50;

  async function keysPage(page, params, ns) {
    const prefix = params.get("prefix") || "";
    const after = params.get("after") || "";
    const input = h("input", { name: "prefix", value: prefix, autocomplete: "off" });
    const form = h("form", { class: "controls", role: "search" },
      h("label", {}, h("span", {}, "Key prefix"), input),
      h("button", { type: "submit" }, "Search"));
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      const next = carry(params);
      if (input.value) next.set("prefix", input.value);
      location.hash = link(["keys", ns], next);
    });
    page.append(
      h("p", { class: "crumbs" }, h("a", { href: link([], carry(params)) }, "Overview")),
      h("h1", {}, `Keys of ${ns}`), form);
    const answer = await api(`/v1/ns/${encodeURIComponent(ns)}/keys`, { prefix, after, limit: PAGE });
    if (answer.keys.length === 0) {
      page.append(h("p", { class: "state", "data-testid": "empty" },
        prefix ? `No key starts with “${prefix}”${after ? " after this point" : ""}.` : "No keys."));
    } else {
      page.append(h("ul", { class: "keys" }, answer.keys.map((k) => h("li", {},
        h("a", { href: link(["key", ns, k], carry(params)), "data-testid": "key-link" }, k)))));
    }
    const nav = h("nav", { class: "pages", "aria-label": "pages" });
    const base = carry(params);
    if (prefix) base.set("prefix", prefix);
    if (after) nav.append(h("a", { href: link(["keys", ns], base) }, "First page"));
    if (answer.next !== null && answer.next !== undefined) {
      const next = new URLSearchParams(base);
      next.set("after", answer.next);
      nav.append(h("a", { href: link(["keys", ns], next), "data-testid": "next-page" }, "Next page"));
    }
    page.append(nav);
  }

  // ---- the token ------------------------------------------------------------------------

  function tokenForm(page, err) {
    const input = h("input", { type: "password", name: "token", autocomplete: "off", required: true });
    const form = h("form", { class: "card token", "data-testid": "token-form" },
      h("h1", {}, "Token needed"),
      h("p", {}, "This server asks for a token (", h("span", { "data-testid": "error", "data-code": err.code }, err.message),
        "). It is kept in this tab only (sessionStorage) and sent as Authorization: Bearer."),
      h("label", {}, h("span", {}, "Token"), input),
      h("button", { type: "submit" }, "Use token"));
    input.addEventListener("input", () => input.setCustomValidity(""));
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      // An HTTP header carries printable ASCII only: fetch would refuse anything else, and
      // the page would say the server could not be reached.
      input.value = input.value.trim();
      if (!/^[\x21-\x7e]+$/.test(input.value)) {
        input.setCustomValidity("A token is printable ASCII, with no spaces.");
        input.reportValidity();
        return;
      }
      try { sessionStorage.setItem(TOKEN_KEY, input.value); } catch { /* private mode: no token kept */ }
      render();
    });
    page.replaceChildren(form);
    return input;
  }

  // ---- the page -------------------------------------------------------------------------

  async function render() {
    clearTimeout(refreshTimer);
    const gen = ++generation;
    const main = document.getElementById("main");
    const forget = document.getElementById("forget-token");
    forget.hidden = !token();
    document.body.dataset.state = "loading";
    const { parts, params } = parseRoute();
    const page = h("div", { class: "page" });
    main.setAttribute("aria-busy", "true");
    // An auto-refresh keeps the old numbers on screen until the new ones are in.
    const refreshing = main.dataset.route === location.hash && main.childElementCount > 0;
    if (!refreshing) main.replaceChildren(page);
    main.dataset.route = location.hash;
    let focus = null;
    try {
      if (parts.length === 0) await overview(page, params);
      else if (parts[0] === "key" && parts.length === 3) await keyPage(page, params, parts[1], parts[2]);
      else if (parts[0] === "keys" && parts.length === 2) await keysPage(page, params, parts[1]);
      else page.append(h("h1", {}, "Not found"), h("p", {}, h("a", { href: "#/" }, "Back to the overview")));
    } catch (e) {
      if (gen !== generation) return;
      if (!(e instanceof ApiError)) e = new ApiError(0, "script_error", String(e));
      if (e.status === 401) focus = tokenForm(page, e);
      else page.append(errorBox(e));
    }
    if (gen !== generation) return;
    if (refreshing) main.replaceChildren(page);
    main.removeAttribute("aria-busy");
    if (focus) focus.focus();
    document.body.dataset.state = "ready";
    const every = Number(params.get("refresh"));
    if (every > 0 && !focus) refreshTimer = setTimeout(() => refresh(every), every * 1000);
  }

  /** An auto-refresh: put off while a control of the page has the focus, since the page
   *  (its form included) is built anew and what is being typed there would be lost. */
  function refresh(every) {
    const active = document.activeElement;
    const typing = active && active.closest && active.closest("#main form");
    if (typing) refreshTimer = setTimeout(() => refresh(every), every * 1000);
    else render();
  }

  document.getElementById("forget-token").addEventListener("click", () => {
    try { sessionStorage.removeItem(TOKEN_KEY); } catch { /* nothing kept */ }
    render();
  });
  window.addEventListener("hashchange", () => {
    document.getElementById("main").dataset.route = "";
    render();
  });
  render();
})();
