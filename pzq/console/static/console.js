/* pzq console: fetch this page's JSON twin every 2 s and update its figures and charts in place.
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

  function number(v) {
    if (typeof v !== "number") { return "-"; }
    return Math.abs(v) >= 100 || Number.isInteger(v) ? Math.round(v).toLocaleString("en") : v.toFixed(2);
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
        legend: { show: false },
        cursor: { drag: { x: false, y: false } },
        scales: { x: { time: true } },
        axes: [{ space: 70, values: clock }, { size: 60, label: chart.unit }],
        series: [{}, { label: chart.title, stroke: "#2563eb", width: 1.5, fill: "rgba(37,99,235,0.08)" }]
      }, data, holder);
    } else {
      plot.setData(data);
    }
    el.dataset.points = String(chart.t.length);
    el.dataset.lastAt = chart.t.length ? String(chart.t[chart.t.length - 1]) : "";
    var last = el.querySelector("[data-chart-last]");
    if (last) { setText(last, chart.v.length ? number(chart.v[chart.v.length - 1]) : "-"); }
  }

  function apply(data) {
    var figures = data.figures || {};
    document.querySelectorAll("[data-figure]").forEach(function (el) { setText(el, figures[el.dataset.figure]); });
    var snap = data.snapshot || {};
    document.querySelectorAll("[data-snapshot]").forEach(function (el) { setText(el, snap[el.dataset.snapshot]); });
    var charts = data.charts || {};
    document.querySelectorAll("[data-chart]").forEach(function (el) {
      var chart = charts[el.dataset.chart];
      if (chart) { draw(el, chart); }
    });
    body.dataset.updated = String(snap.at || "");
  }

  function tick() {
    timer = null;
    if (pause && pause.checked) { say("paused"); return; }
    fetch(url, { credentials: "same-origin", cache: "no-store", headers: { Accept: "application/json" } })
      .then(function (r) {
        // (403: pzq's permissions hide part of the page from the console; its figures are still live)
        if (!r.ok && r.status !== 403) { throw new Error("HTTP " + r.status); }
        return r.json();
      })
      .then(function (data) { apply(data); say("live, " + new Date().toLocaleTimeString()); })
      .catch(function (e) { say("no answer (" + e.message + ")"); })
      .then(function () { if (!timer) { timer = setTimeout(tick, EVERY_MS); } });
  }

  if (pause) {
    pause.checked = window.localStorage && localStorage.getItem("pzq-paused") === "1";
    pause.addEventListener("change", function () {
      if (window.localStorage) { localStorage.setItem("pzq-paused", pause.checked ? "1" : "0"); }
      if (!pause.checked && !timer) { tick(); } else { say("paused"); }
    });
  }
  if (url) { tick(); }
})();
