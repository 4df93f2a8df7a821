/* pzq console: fetch this page's JSON twin every 2 s and update in place its figures, its live tables
   (rows kept by key: the scroll and an open form stay where they were) and its charts, over the range
   chosen (5 minutes, 1 hour, 24 hours; switched without a reload). Numbers come as numbers, each with
   its unit, and are shown by the rules of pzq/console/formats.py, exact in the title (the hover).
   No inline script anywhere (CSP script-src 'self'); values go in as text, never as markup. */
(function () {
  "use strict";
  var EVERY_MS = 2000;
  var body = document.body;
  var url = body.dataset.json;
  var pause = document.getElementById("pause");
  var state = document.getElementById("live-state");
  var plots = {};
  var timer = null;

  function say(text) { if (state) { state.textContent = text; } }

  function setText(el, text) {
    if (text === undefined || text === null || el.textContent === String(text)) { return; }
    el.textContent = String(text);
    el.classList.remove("changed");
    void el.offsetWidth;  // (restarts the highlight)
    el.classList.add("changed");
  }

  function isNumber(v) { return typeof v === "number" && isFinite(v); }

  function number(v) {
    if (!isNumber(v)) { return "-"; }
    if (Number.isInteger(v) || Math.abs(v) >= 100) { return Math.round(v).toLocaleString("en"); }
    return v.toLocaleString("en", { minimumFractionDigits: 2, maximumFractionDigits: 2 });
  }

  function size(v) {
    var units = ["B", "KiB", "MiB", "GiB", "TiB"];
    for (var i = 0; i < units.length; i++) {
      if (Math.abs(v) < 1024 || i === units.length - 1) {
        if (i === 0) { return Math.round(v).toLocaleString("en") + " B"; }
        return v.toLocaleString("en", { minimumFractionDigits: 1, maximumFractionDigits: 1 }).replace(/\.0$/, "") + " " + units[i];
      }
      v /= 1024;
    }
    return "-";
  }

  function duration(v) {
    if (v === 0) { return "0 s"; }
    if (Math.abs(v) < 1) { return (v * 1000).toFixed(0) + " ms"; }
    if (Math.abs(v) < 120) { return v.toFixed(1) + " s"; }
    var steps = [[7200, "min", 60], [172800, "h", 3600]];
    for (var i = 0; i < steps.length; i++) {
      if (Math.abs(v) < steps[i][0]) { return (v / steps[i][2]).toFixed(1).replace(/\.0$/, "") + " " + steps[i][1]; }
    }
    return (v / 86400).toLocaleString("en", { minimumFractionDigits: 1, maximumFractionDigits: 1 }) + " d";
  }

  function when(us) {
    if (!isNumber(us) || us <= 0) { return "-"; }
    return new Date(us / 1000).toISOString().slice(0, 19).replace("T", " ") + " UTC";
  }

  function show(v, unit) {  // (formats.show)
    if (unit === "text") { return v === null || v === undefined || v === "" ? "-" : String(v); }
    if (!isNumber(v)) { return "-"; }
    if (unit === "bytes") { return size(v); }
    if (unit === "s") { return duration(v); }
    if (unit === "ms") { return Math.abs(v) < 10 ? v.toFixed(2) + " ms" : number(v) + " ms"; }
    if (unit === "time_us") { return when(v); }
    if (unit === "msg/s") { return number(v) + " msg/s"; }
    return number(v);
  }

  function exact(v, unit) {  // (formats.exact: what a cell's title says)
    if (!isNumber(v) || unit === "text" || unit === "time_us") { return ""; }
    var text = Number.isInteger(v) ? v.toLocaleString("en") : v.toLocaleString("en", { maximumFractionDigits: 20 });
    var names = { bytes: " bytes", s: " s", ms: " ms", "msg/s": " msg/s" };
    return text + (names[unit] || "");
  }

  function at(data, path) {  // ("tables.0.rows" -> data.tables[0].rows)
    return path.split(".").reduce(function (v, k) { return v === null || v === undefined ? v : v[k]; }, data);
  }

  function cell(td, value, unit, link, first, table) {
    if (first && link) {
      var a = td.querySelector("a");
      if (!a) { a = document.createElement("a"); td.textContent = ""; td.appendChild(a); }
      a.href = link + encodeURIComponent(value);
      if (a.textContent !== String(value)) { a.textContent = String(value); }
      if (table.dataset.live === "queues") { td.dataset.queue = String(value); }
    } else {
      setText(td, show(value, unit));
    }
    var title = exact(value, unit);
    if (!title) { td.removeAttribute("title"); } else if (td.title !== title) { td.title = title; }
  }

  function liveTable(table, data) {
    var rows = at(data, table.dataset.rows);
    var tbody = table.tBodies[0];
    if (!Array.isArray(rows) || !tbody) { return; }
    var columns = Array.prototype.map.call(table.querySelectorAll("thead th[data-key]"), function (th) {
      return { key: th.dataset.key, unit: th.dataset.unit || "count" };
    });
    var keyOf = table.dataset.rowKey;
    var link = table.dataset.link || "";
    var old = {};
    Array.prototype.forEach.call(tbody.rows, function (tr) { if (tr.dataset.key !== undefined) { old[tr.dataset.key] = tr; } });
    var wanted = rows.map(function (row) {
      var key = String(keyOf ? row[keyOf] : (row.key !== undefined ? row.key : row[columns[0].key]));
      var tr = old[key];
      delete old[key];
      if (!tr) {
        tr = document.createElement("tr");
        tr.dataset.key = key;
        columns.forEach(function (c, i) {
          var td = document.createElement("td");
          if (i === 0) { td.className = "name"; } else { td.dataset.column = c.key; }
          if (i > 0 && c.unit === "text") { td.className = "text"; }
          tr.appendChild(td);
        });
      }
      columns.forEach(function (c, i) { cell(tr.cells[i], row[c.key], c.unit, link, i === 0, table); });
      return tr;
    });
    Object.keys(old).forEach(function (key) { old[key].remove(); });  // (gone since)
    var none = tbody.querySelector("tr.none");
    wanted.forEach(function (tr, i) {  // (in the twin's order; a row already in place is not moved)
      if (tbody.rows[i] !== tr) { tbody.insertBefore(tr, tbody.rows[i] || null); }
    });
    if (!wanted.length && !none) {
      none = document.createElement("tr");
      none.className = "none";
      var td = document.createElement("td");
      td.colSpan = columns.length;
      td.className = "empty";
      td.textContent = "none";
      none.appendChild(td);
      tbody.appendChild(none);
    } else if (wanted.length && none) {
      none.remove();
    }
    table.dataset.rowsShown = String(wanted.length);
  }

  function clock(u, splits) {  // (the time axis in UTC, as the page's "figures as of" line)
    return splits.map(function (t) { return new Date(t * 1000).toISOString().slice(11, 19); });
  }

  function draw(el, chart) {
    var key = el.dataset.chart;
    var data = [chart.t, chart.v];
    var plot = plots[key];
    if (!plot) {
      if (typeof uPlot === "undefined") { return; }
      var holder = el.querySelector(".plot");
      var section = el.parentElement;  // (two charts a row in the space the page gives them)
      var width = Math.max(280, Math.min(560, Math.floor(((section && section.clientWidth) || 600) / 2) - 40));
      plot = plots[key] = new uPlot({
        width: width,
        height: 150,
        // (the legend shows the values under the cursor: the time and the figure, as the hover's)
        legend: { show: true, live: true },
        cursor: { drag: { x: false, y: false } },
        scales: { x: { time: true } },
        axes: [{ space: 70, values: clock }, { size: 60, label: chart.unit }],
        series: [
          { label: "UTC", value: function (u, t) { return t === null ? "-" : new Date(t * 1000).toISOString().slice(0, 19).replace("T", " "); } },
          {
            label: chart.title, stroke: "#2563eb", width: 1.5, fill: "rgba(37,99,235,0.08)",
            value: function (u, v) { return v === null ? "-" : number(v) + " " + chart.unit; }
          }
        ]
      }, data, holder);
    } else {
      plot.setData(data);
    }
    el.dataset.points = String(chart.t.length);
    el.dataset.lastAt = chart.t.length ? String(chart.t[chart.t.length - 1]) : "";
    el.dataset.firstAt = chart.t.length ? String(chart.t[0]) : "";
    var last = el.querySelector("[data-chart-last]");
    if (last) { setText(last, chart.v.length ? number(chart.v[chart.v.length - 1]) : "-"); }
  }

  function apply(data) {
    var figures = data.figures || {};
    var units = data.units || {};
    document.querySelectorAll("[data-figure]").forEach(function (el) {
      var key = el.dataset.figure;
      if (!(key in figures)) { return; }
      var unit = units[key] || el.dataset.unit || "count";
      setText(el, show(figures[key], unit));
      if (el.tagName === "TD") { el.title = exact(figures[key], unit); }
    });
    var snap = data.snapshot || {};
    document.querySelectorAll("[data-snapshot]").forEach(function (el) { setText(el, snap[el.dataset.snapshot]); });
    document.querySelectorAll("table[data-live]").forEach(function (table) { liveTable(table, data); });
    var charts = data.charts || {};
    document.querySelectorAll("[data-chart]").forEach(function (el) {
      var chart = charts[el.dataset.chart];
      if (chart) { draw(el, chart); el.dataset.range = snap.range || ""; }
    });
    body.dataset.updated = String(snap.at || "");
  }

  function tick(force) {
    timer = null;
    if (pause && pause.checked && force !== true) { say("paused"); return; }
    var asked = url;
    fetch(asked, { credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (r) {
        // (403: pzq's permissions hide part of the page from the console; its figures are still live)
        if (!r.ok && r.status !== 403) { throw new Error("HTTP " + r.status); }
        return r.json();
      })
      .then(function (data) {
        if (asked !== url) { return; }  // (a range chosen meanwhile: its answer is on its way)
        apply(data);
        say("live, " + new Date().toLocaleTimeString());
      })
      .catch(function (e) { say("no answer (" + e.message + ")"); })
      .then(function () { if (!timer) { timer = setTimeout(tick, EVERY_MS); } });
  }

  function chooseRange(event) {  // (the charts' range: the page's address and its twin's, no reload)
    var link = event.currentTarget;
    var range = link.dataset.range;
    event.preventDefault();
    var twin = new URL(url, location.href);
    twin.searchParams.set("range", range);
    url = twin.pathname + twin.search;
    var here = new URL(location.href);
    here.searchParams.set("range", range);
    history.replaceState(null, "", here.pathname + here.search);
    document.querySelectorAll("a[data-range]").forEach(function (a) {
      a.classList.toggle("chosen", a === link);
      if (a === link) { a.setAttribute("aria-current", "true"); } else { a.removeAttribute("aria-current"); }
    });
    if (timer) { clearTimeout(timer); timer = null; }
    tick(true);
  }

  document.querySelectorAll("a[data-range]").forEach(function (a) { a.addEventListener("click", chooseRange); });
  if (pause) {
    pause.checked = window.localStorage && localStorage.getItem("pzq-paused") === "1";
    pause.addEventListener("change", function () {
      if (window.localStorage) { localStorage.setItem("pzq-paused", pause.checked ? "1" : "0"); }
      if (!pause.checked && !timer) { tick(); } else { say("paused"); }
    });
  }
  if (url) { tick(); }
})();
