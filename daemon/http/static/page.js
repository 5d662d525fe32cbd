// rackguard's node page: reads this agent's API, updates on /v1/events. No build step,
// no library, nothing fetched from anywhere but the agent itself; read-only.
"use strict";

const $ = (id) => document.getElementById(id);
const fmt = (v, digits = 1) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));

function duration(s) {
  if (s === null || s === undefined) return "–";
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 5400) return `${Math.round(s / 60)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

async function getJson(path) {
  const resp = await fetch(path, { cache: "no-store" });
  if (!resp.ok) throw new Error(`${path}: HTTP ${resp.status}`);
  return resp.json();
}

// A GPU NVML has lost is not a sensor question ("unknown"): it is gone until reset.
const LOST = /NVML_ERROR_GPU_IS_LOST/;
const LOST_WORDS =
  "GPU lost: NVML cannot reach it (NVML_ERROR_GPU_IS_LOST), as after it overheated to" +
  " shutdown or fell off the bus; it needs a reset or a reboot";

function renderGpus(gpus) {
  const body = $("gpus").tBodies[0];
  body.replaceChildren();
  for (const g of gpus) {
    const row = body.insertRow();
    const index = g.subject.replace(/^gpu/, "");
    const lost = g.condition === "unknown" && LOST.test(g.detail || "");
    const condition = lost ? "lost" : g.condition;
    row.dataset.gpu = index;
    row.dataset.condition = condition;
    const margin = g.value !== null && g.threshold !== null ? g.threshold - g.value : null;
    cell(row, g.subject);
    cell(row, `${fmt(g.value)} °C`);
    cell(row, `${fmt(g.threshold, 0)} °C`);
    const m = cell(row, "");
    const bar = document.createElement("span");
    bar.className = "bar";
    bar.style.width = `${Math.max(0, Math.min(margin ?? 0, 40)) * 3}px`;
    m.append(bar, `${fmt(margin)} °C`);
    m.dataset.margin = margin === null ? "" : margin.toFixed(1);
    const trend = g.trend_per_min;
    cell(row, trend === null ? "–" : `${trend > 0 ? "+" : ""}${fmt(trend, 2)} °C/min`);
    cell(row, duration(g.time_to_threshold_s));
    const c = cell(row, "");
    const span = document.createElement("span");
    span.className = "cond";
    span.textContent = condition;
    c.append(span);
    cell(row, lost ? LOST_WORDS : g.detail, "detail");
  }
}

// Units as people read them (the API's are spelled out for machines).
const UNITS = {
  celsius: (v) => `${fmt(v)} °C`,
  liters_per_minute: (v) => `${fmt(v)} L/min`,
  kilopascals: (v) => `${fmt(v)} kPa`,
  rpm: (v) => `${fmt(v, 0)} rpm`,
  percent: (v) => `${fmt(v, 0)} %`,
  watts: (v) => `${fmt(v, 0)} W`,
  bool: (v) => (v ? "on" : "off"),
};

function humane(value, unit) {
  const f = UNITS[unit];
  return f ? f(value) : `${fmt(value)} ${unit}`;
}

// The daemon's recent points of each charted series and the policy's GPU forecasts
// (/v1/charts; embedded in the page, so history from before it was opened shows at once).
let CHARTS = { window_s: 600, step_s: 5, series: [], forecasts: [] };
const FORECAST_S = 300;
let DECISION_TIMES = [];

const SVG = "http://www.w3.org/2000/svg";
function el(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (parent) parent.append(node);
  return node;
}

// A chart's frame: time runs over the window and the forecast; values fit ``extra``.
function frame(points, extra, now, W, H, P) {
  const window_s = CHARTS.window_s;
  const values = [...points.map((p) => p[1]), ...extra];
  const lo = Math.min(...values) - 2, hi = Math.max(...values) + 2;
  return {
    x: (t) => P + ((t - (now - window_s)) / (window_s + FORECAST_S)) * (W - 2 * P),
    y: (v) => H - P - ((v - lo) / (hi - lo || 1)) * (H - 2 * P),
  };
}

function drawSeries(svg, points, f, now, H) {
  el("line", { class: "now", x1: f.x(now), x2: f.x(now), y1: 0, y2: H }, svg);
  for (const t of DECISION_TIMES) {
    if (t >= now - CHARTS.window_s) el("line", { class: "decision", x1: f.x(t), x2: f.x(t), y1: 0, y2: H }, svg);
  }
  if (!points.length) return;
  const pts = points.map(([t, v]) => `${f.x(t).toFixed(1)},${f.y(v).toFixed(1)}`).join(" ");
  el("polyline", { class: "temp", points: pts }, svg);
  const last = points[points.length - 1];
  el("circle", { class: "temp", cx: f.x(last[0]), cy: f.y(last[1]), r: 2.5 }, svg);
}

const seriesByKey = () => new Map(CHARTS.series.map((s) => [s.key, s]));

// One chart per GPU: its recent temperature (kept by the daemon), the slowdown line,
// the policy's forecast over the next five minutes with the band of its trend (only a
// trusted trend moves it; else the forecast is the last value), and the decisions.
function renderCharts(gpus, now) {
  const box = $("charts");
  box.replaceChildren();
  if (!gpus.length) {
    box.textContent = "No GPU readings yet.";
    return;
  }
  const W = 260, H = 96, P = 4;
  const series = seriesByKey();
  const forecasts = new Map(CHARTS.forecasts.map((f) => [f.gpu, f]));
  for (const g of gpus) {
    const fig = document.createElement("figure");
    fig.dataset.gpu = g.subject;
    const cap = document.createElement("figcaption");
    cap.textContent = `${g.subject} ${g.value === null ? "no reading" : humane(g.value, "celsius")}`;
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img" });
    const points = (series.get(g.subject) || { points: [] }).points;
    const slow = g.threshold;
    const last = points.length ? points[points.length - 1] : null;
    const fc = forecasts.get(g.subject);
    const trusted = !!(fc && fc.trusted && fc.per_min !== null);
    const at = (perMin) => (last ? last[1] + (trusted ? (perMin / 60) * FORECAST_S : 0) : null);
    const ahead = at(trusted ? fc.per_min : 0);
    const band = trusted ? [at(fc.low_per_min), at(fc.high_per_min)] : [];
    const extra = [...(slow !== null ? [slow + 2] : []), ...(ahead !== null ? [ahead] : []), ...band, 30];
    const f = frame(points, extra, now, W, H, P);
    if (slow !== null) {
      el("line", { class: "slowdown", x1: 0, x2: W, y1: f.y(slow), y2: f.y(slow) }, svg);
      el("text", { class: "label", x: P, y: f.y(slow) - 2 }, svg).textContent = `slowdown ${fmt(slow, 0)} °C`;
    }
    if (last && band.length) {
      const end = f.x(last[0] + FORECAST_S);
      const corners = [[f.x(last[0]), f.y(last[1])], [end, f.y(band[0])], [end, f.y(band[1])]];
      el("polygon", { class: "band", points: corners.map((c) => c.map((v) => v.toFixed(1)).join(",")).join(" ") }, svg);
    }
    drawSeries(svg, points, f, now, H);
    if (ahead !== null) {
      const cls = trusted ? "forecast" : "forecast persistence";
      el("line", { class: cls, x1: f.x(last[0]), y1: f.y(last[1]), x2: f.x(last[0] + FORECAST_S), y2: f.y(ahead) }, svg);
    }
    fig.title = trusted
      ? `trend ${fmt(fc.per_min, 2)} °C/min (band ${fmt(fc.low_per_min, 2)} to ${fmt(fc.high_per_min, 2)})`
      : "no trusted trend: the forecast is the last value";
    fig.append(cap, svg);
    box.append(fig);
  }
}

// The rack's inlet air and the loop's supply temperature, flow and pressure.
function renderRackCharts(now) {
  const box = $("rack-charts");
  const rack = CHARTS.series.filter((s) => !s.key.startsWith("gpu"));
  box.replaceChildren();
  if (!rack.length) {
    box.textContent = "No rack sources: no inlet air or coolant loop readings to chart.";
    return;
  }
  const W = 260, H = 96, P = 4;
  for (const s of rack) {
    const fig = document.createElement("figure");
    fig.dataset.kind = s.kind;
    const cap = document.createElement("figcaption");
    const what = RACK_KINDS[s.kind] || s.kind;
    const last = s.points.length ? s.points[s.points.length - 1][1] : null;
    cap.textContent = `${s.probe ? `${what} (${s.probe})` : what} ${last === null ? "no reading" : humane(last, s.unit)}`;
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img" });
    drawSeries(svg, s.points, frame(s.points, [], now, W, H, P), now, H);
    fig.append(cap, svg);
    box.append(fig);
  }
}

const RACK_KINDS = {
  inlet_temperature: "inlet air",
  coolant_supply_temperature: "coolant supply",
  coolant_return_temperature: "coolant return",
  coolant_flow: "coolant flow",
  coolant_differential_pressure: "coolant dP",
  pump_state: "pump",
  leak: "leak",
};

function renderState(state) {
  $("node").textContent = state.node;
  $("rack").textContent = state.rack ? `rack ${state.rack}` : "";
  document.title = `rackguard ${state.node}`;
  const cond = $("condition");
  cond.dataset.condition = state.condition;
  cond.textContent = state.condition;
  const body = $("rack-series").tBodies[0];
  body.replaceChildren();
  for (const s of state.series) {
    const what = RACK_KINDS[s.kind];
    if (!what) continue;
    const row = body.insertRow();
    row.dataset.kind = s.kind;
    cell(row, s.labels.probe ? `${what} (${s.labels.probe})` : what);
    cell(row, s.value === null ? `BAD: ${s.reason}` : humane(s.value, s.unit));
    cell(row, s.quality === "good" ? "" : s.quality);
  }
}

function renderRack(rack) {
  $("rack-detail").textContent = rack ? rack.detail || rack.condition : "no rack evidence (no PDU or CDU source)";
}

const clock = (t) =>
  t === null || t === undefined
    ? "–"
    : new Date(t * 1000).toLocaleTimeString("en-GB", { hour12: false });

// Where a logged decision's delivery stands, in words (its `delivery` in /v1/decisions).
function deliveryText(dv) {
  if (!dv) return "";
  const tries = `${dv.attempts} attempt${dv.attempts === 1 ? "" : "s"}`;
  if (dv.status === "confirmed") {
    const how = dv.confirmed_by === "read_back" ? "confirmed by read-back" : "accepted by the scheduler";
    return `${how} at ${clock(dv.done_at)}`;
  }
  if (dv.status === "pending") {
    return dv.last_error ? `NOT DELIVERED: ${tries}, last error: ${dv.last_error}` : `pending (${tries})`;
  }
  if (dv.status === "failed") return `FAILED: ${dv.last_error || dv.outcome}`;
  return `${dv.status}${dv.outcome ? `: ${dv.outcome}` : ""}`;
}

function renderTimeline(items) {
  const list = $("timeline");
  list.replaceChildren();
  if (!items.length) {
    const li = document.createElement("li");
    li.className = "empty";
    li.textContent = "No decisions yet: nothing was drained, excluded or resumed.";
    list.append(li);
    return;
  }
  for (const item of items) {
    const d = { ...item, ...(item.decision || {}) };
    const li = document.createElement("li");
    li.dataset.action = item.action || "";
    const c = item.cap;
    const verb = item.kind === "override" ? `override ${item.action}`
      : c ? `${item.action} ${c.gpu} ${Math.round(c.watts)} W` : item.action;
    const b = document.createElement("b");
    b.textContent = verb;
    const why = d.reason || (item.override && item.override.reason)
      || (c && (c.error ? `refused: ${c.error}` : c.reason)) || "";
    li.append(`${clock(item.at)} `, b, ` ${item.node || ""} — ${why}`);
    if (item.delivery) {
      const span = document.createElement("span");
      span.className = "delivery";
      span.dataset.status = item.delivery.status;
      span.textContent = deliveryText(item.delivery);
      li.append(" ", span);
    }
    list.append(li);
  }
}

const ACTION_WORDS = { drain: "drained", exclude: "excluded", resume: "in service" };
const INTENDED = { drain: "drained", exclude: "down", resume: "in service" };

function renderAction(action) {
  const badge = $("action");
  badge.dataset.action = action;
  badge.textContent = ACTION_WORDS[action] || action;
}

// The scheduler's side beside rackguard's intent, shown only when they differ.
function renderScheduler(s) {
  const el = $("scheduler");
  if (!s || !s.intent) {
    el.hidden = true;
    return;
  }
  renderAction(s.intent);
  let text = "";
  if (s.delivery === "pending") {
    text = s.last_error ? `scheduler: not delivered (${s.attempts} attempts: ${s.last_error})` : "scheduler: delivering…";
  } else if (s.delivery === "failed") {
    text = `scheduler: delivery failed${s.last_error ? `: ${s.last_error}` : ""}`;
  } else if (s.read_back !== null && !s.read_back.startsWith(INTENDED[s.intent])) {
    text = `scheduler shows: ${s.read_back} (read back ${clock(s.read_back_at)})`;
  }
  el.dataset.delivery = s.delivery || "";
  el.textContent = text;
  el.hidden = !text;
}

function renderSources(sources) {
  const list = $("sources");
  list.replaceChildren();
  for (const [name, s] of Object.entries(sources)) {
    const li = document.createElement("li");
    li.dataset.health = s.health;
    li.textContent = `${name}: ${s.health}${s.last_error ? ` (${s.last_error})` : ""}`;
    list.append(li);
  }
}

// One line per capped GPU: its limit and who set it (rackguard's ladder or another actor).
function renderCaps(caps) {
  const list = $("caps");
  const capped = (caps.gpus || []).filter((g) => g.cap_w !== null);
  const lines = capped.map((g) => {
    const li = document.createElement("li");
    li.dataset.setBy = g.set_by;
    const before = g.before_w !== null ? ` (restores to ${Math.round(g.before_w)} W)` : "";
    li.textContent = `gpu${g.gpu} capped to ${Math.round(g.cap_w)} W by ${g.set_by}${before}`;
    return li;
  });
  if (!lines.length) {
    const li = document.createElement("li");
    li.textContent = caps.enabled ? "none" : "power capping off";
    lines.push(li);
  }
  list.replaceChildren(...lines);
}

async function refresh() {
  const [assess, state, caps, charts] = await Promise.all([
    getJson("v1/assessments"),
    getJson("v1/state"),
    getJson("v1/power-caps"),
    getJson("v1/charts"),
  ]);
  CHARTS = charts;
  show(assess, state);
  renderCaps(caps);
}

function show(assess, state) {
  renderGpus(assess.gpus || []);
  const now = Date.now() / 1000;
  renderCharts(assess.gpus || [], now);
  renderRackCharts(now);
  renderRack(assess.rack);
  renderState(state);
  $("simulated").hidden = !state.simulated;
  renderSources(state.sources || {});
  renderScheduler(state.scheduler);
}

// The log is re-read on every decision or delivery event: it holds each decision's delivery.
async function loadTimeline() {
  showLog(await getJson("v1/decisions?limit=50"));
}

function showLog(log) {
  renderTimeline(log.items || []);
  DECISION_TIMES = (log.items || []).filter((i) => i.kind === "decision").map((i) => i.at);
  const last = (log.items || []).find((i) => i.kind === "decision");
  if (last) renderAction(last.action);
}

function listen() {
  const events = new EventSource("v1/events");
  events.onopen = () => {
    document.body.dataset.live = "connected";
    $("live").textContent = "live";
  };
  events.onerror = () => {
    document.body.dataset.live = "reconnecting";
    $("live").textContent = "reconnecting…";
  };
  const bump = () => {
    document.body.dataset.events = String(Number(document.body.dataset.events) + 1);
    refresh().catch(() => {});
  };
  const relog = () => loadTimeline().catch(() => {});
  events.addEventListener("decision", (e) => {
    renderAction(JSON.parse(e.data).action);
    bump();
    relog();
  });
  for (const kind of ["delivery", "override"]) {
    events.addEventListener(kind, () => {
      bump();
      relog();
    });
  }
  events.addEventListener("assessment", bump);
  events.addEventListener("power_cap", bump);
}

async function main() {
  // The data the page was served with: drawn before the load event, no round trip.
  const initial = document.getElementById("initial");
  if (initial) {
    const data = JSON.parse(initial.textContent);
    if (data.charts) CHARTS = data.charts;
    showLog(data.decisions);
    show(data.assessments, data.state);
  }
  listen();
  await Promise.all([refresh(), loadTimeline()]).catch((err) => {
    $("live").textContent = String(err);
  });
  // Temperatures change between events: a light poll keeps the table current.
  setInterval(() => refresh().catch(() => {}), 2000);
}

main();
