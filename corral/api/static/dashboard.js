// The fleet view: reads /dashboard/data.json every 2 s and draws it with uPlot. Every number shown
// comes from that document; the page only keeps a short history for the charts over time.
"use strict";

const REFRESH_MS = 2000;
const HISTORY = 150; // points kept for the charts over time (5 minutes at 2 s)
const COLORS = ["#2f6fdf", "#e8833a", "#3aa655", "#b83280", "#6b7280", "#c9a227"];

const history = { t: [], max: [], median: [], p50: [], p99: [], refusals: {} };
let lastRefusals = null;
let charts = {};
let hostKey = "";

function text(id, value) {
  document.getElementById(id).textContent = value;
}

function fmt(v, digits = 0) {
  return v === null || v === undefined ? "-" : Number(v).toFixed(digits);
}

function width(el) {
  return Math.max(320, el.clientWidth - 10);
}

function hostAxis(hosts) {
  return {
    splits: () => hosts.map((_, i) => i),
    values: (u, splits) => splits.map((i) => (hosts[i] ? hosts[i].id : "")),
    rotate: hosts.length > 8 ? -45 : 0,
    size: hosts.length > 8 ? 70 : 40,
  };
}

// Per host: the first series as bars, the others as points joined by lines, over the host index.
function hostsPlot(id, hosts, series) {
  const el = document.getElementById(id);
  const opts = {
    width: width(el),
    height: 230,
    scales: { x: { time: false, range: [-0.5, hosts.length - 0.5] }, y: { range: (u, lo, hi) => [0, Math.max(1, hi) * 1.1] } },
    axes: [hostAxis(hosts), { size: 64 }],
    series: [{}].concat(
      series.map((s, i) =>
        i === 0
          ? { label: s, stroke: COLORS[0], fill: COLORS[0] + "88", width: 1, paths: uPlot.paths.bars({ size: [0.6, 80] }), points: { show: false } }
          : { label: s, stroke: COLORS[i], width: 2, points: { show: true, size: 7 } },
      ),
    ),
    legend: { live: false },
    cursor: { show: false },
  };
  el.textContent = "";
  return new uPlot(opts, [hosts.map((_, i) => i)].concat(series.map(() => hosts.map(() => 0))), el);
}

function linesPlot(id, labels, time) {
  const el = document.getElementById(id);
  const opts = {
    width: width(el),
    height: 230,
    scales: { x: { time: time !== false }, y: { range: (u, lo, hi) => [0, Math.max(1, hi) * 1.1] } },
    axes: [{}, { size: 64 }],
    series: [{}].concat(labels.map((s, i) => ({ label: s, stroke: COLORS[i % COLORS.length], width: 2, points: { show: time === false } }))),
    legend: { live: false },
  };
  el.textContent = "";
  return new uPlot(opts, [[]].concat(labels.map(() => [])), el);
}

function push(arr, v) {
  arr.push(v);
  if (arr.length > HISTORY) arr.shift();
}

function renderTable(hosts) {
  const body = document.querySelector("#hosts tbody");
  body.textContent = "";
  for (const h of hosts) {
    const tr = document.createElement("tr");
    tr.dataset.host = h.id;
    const cells = [
      ["id", h.id],
      ["state", h.state],
      ["heartbeat_age_s", fmt(h.heartbeat_age_s, 1)],
      ["sandboxes", h.sandboxes],
      ["placements_60s", h.placements_60s],
      ["memory_mb_admittable", h.memory_mb_admittable],
      ["reserved_mb", h.reserved_mb],
      ["resident_mb", h.resident_mb],
      ["committed_mb", h.committed_mb],
      ["latency", fmt(h.create_latency.p50_ms, 1) + " / " + fmt(h.create_latency.p99_ms, 1)],
    ];
    for (const [k, v] of cells) {
      const td = document.createElement("td");
      td.dataset.k = k;
      td.textContent = v;
      tr.appendChild(td);
    }
    body.appendChild(tr);
  }
}

function render(d) {
  const f = d.fleet;
  const r = d.requests;
  text("f-hosts", f.hosts);
  text("f-sandboxes", f.sandboxes);
  text("f-maxmed", f.max + " / " + fmt(f.median, 1));
  text("f-placements", f.placements_60s);
  text("f-viewage", fmt(f.view_age_s, 1) + " s");
  text("f-latency", fmt(r.create_latency.p50_ms, 1) + " / " + fmt(r.create_latency.p99_ms, 1) + " ms");
  text("f-replica", r.replica);
  text("f-r2s", fmt(r.refusal_to_success.p50_ms / 1000, 2) + " / " + fmt(r.refusal_to_success.p99_ms / 1000, 2) + " s");
  const total = Object.values(r.refusals).reduce((a, b) => a + b, 0);
  text("f-refusals", total);
  renderTable(d.hosts);

  const key = d.hosts.map((h) => h.id).join(",");
  if (key !== hostKey) {
    hostKey = key;
    charts.load = hostsPlot("chart-load", d.hosts, ["sandboxes", "placed 60 s"]);
    charts.memory = hostsPlot("chart-memory", d.hosts, ["admittable", "reserved", "resident", "committed"]);
  }
  const xs = d.hosts.map((_, i) => i);
  charts.load.setData([xs, d.hosts.map((h) => h.sandboxes), d.hosts.map((h) => h.placements_60s)]);
  charts.memory.setData([
    xs,
    d.hosts.map((h) => Math.max(0, h.memory_mb_admittable)),
    d.hosts.map((h) => h.reserved_mb),
    d.hosts.map((h) => h.resident_mb),
    d.hosts.map((h) => h.committed_mb),
  ]);

  push(history.t, d.now);
  push(history.max, f.max);
  push(history.median, f.median);
  push(history.p50, r.create_latency.p50_ms);
  push(history.p99, r.create_latency.p99_ms);
  const reasons = Object.keys(r.refusals);
  for (const reason of reasons) {
    if (!history.refusals[reason]) history.refusals[reason] = history.t.map(() => 0);
  }
  for (const reason of Object.keys(history.refusals)) {
    const now = r.refusals[reason] || 0;
    const before = lastRefusals && reason in lastRefusals ? lastRefusals[reason] : now;
    push(history.refusals[reason], Math.max(0, now - before));
  }
  lastRefusals = r.refusals;

  if (!charts.spread) charts.spread = linesPlot("chart-spread", ["max", "median"]);
  if (!charts.latency) charts.latency = linesPlot("chart-latency", ["p50", "p99"]);
  const refusalKeys = Object.keys(history.refusals).sort();
  if (!charts.refusals || charts.refusalKeys !== refusalKeys.join(",")) {
    charts.refusalKeys = refusalKeys.join(",");
    charts.refusals = linesPlot("chart-refusals", refusalKeys.length ? refusalKeys : ["none"]);
  }
  charts.spread.setData([history.t, history.max, history.median]);
  charts.latency.setData([history.t, history.p50, history.p99]);
  charts.refusals.setData(
    [history.t].concat(refusalKeys.length ? refusalKeys.map((k) => history.refusals[k]) : [history.t.map(() => 0)]),
  );
}

let fetchedAt = null;

function ticker() {
  const el = document.getElementById("status");
  if (fetchedAt === null) return;
  const age = (Date.now() - fetchedAt) / 1000;
  el.textContent = "updated " + age.toFixed(0) + " s ago";
  el.classList.toggle("stale", age > (3 * REFRESH_MS) / 1000);
}

async function refresh() {
  try {
    const res = await fetch("/dashboard/data.json", { credentials: "same-origin", cache: "no-store" });
    if (res.status === 401) {
      window.location.reload();
      return;
    }
    if (res.ok) {
      render(await res.json());
      fetchedAt = Date.now();
      document.body.dataset.loaded = String((Number(document.body.dataset.loaded) || 0) + 1);
    }
  } catch (e) {
    document.getElementById("status").textContent = "cannot reach the server";
  } finally {
    ticker();
    setTimeout(refresh, REFRESH_MS);
  }
}

setInterval(ticker, 1000);
refresh();
