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

function renderGpus(gpus) {
  const body = $("gpus").tBodies[0];
  body.replaceChildren();
  for (const g of gpus) {
    const row = body.insertRow();
    const index = g.subject.replace(/^gpu/, "");
    row.dataset.gpu = index;
    row.dataset.condition = g.condition;
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
    const c = cell(row, g.condition);
    c.innerHTML = "";
    const span = document.createElement("span");
    span.className = "cond";
    span.textContent = g.condition;
    c.append(span);
    cell(row, g.detail, "detail");
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

// Recent GPU temperatures seen by this page (the API keeps no history): gpu -> [[t, °C]].
const HISTORY = new Map();
const WINDOW_S = 600;
const FORECAST_S = 300;
let DECISION_TIMES = [];

function remember(gpus, at) {
  for (const g of gpus) {
    if (g.value === null || g.value === undefined) continue;
    const h = HISTORY.get(g.subject) || [];
    if (!h.length || h[h.length - 1][0] < at) h.push([at, g.value]);
    while (h.length && h[0][0] < at - WINDOW_S) h.shift();
    HISTORY.set(g.subject, h);
  }
}

const SVG = "http://www.w3.org/2000/svg";
function el(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (parent) parent.append(node);
  return node;
}

// One chart per GPU: its recent temperature, the slowdown line, the forecast the
// policy's trend gives over the next five minutes, and a mark at each decision.
function renderCharts(gpus, now) {
  const box = $("charts");
  box.replaceChildren();
  if (!gpus.length) {
    box.textContent = "No GPU readings yet.";
    return;
  }
  const W = 260, H = 96, P = 4;
  for (const g of gpus) {
    const fig = document.createElement("figure");
    fig.dataset.gpu = g.subject;
    const cap = document.createElement("figcaption");
    cap.textContent = `${g.subject} ${g.value === null ? "no reading" : humane(g.value, "celsius")}`;
    const svg = el("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img" });
    const h = HISTORY.get(g.subject) || [];
    const slow = g.threshold;
    const last = h.length ? h[h.length - 1] : null;
    const slope = g.trend_per_min === null || g.trend_per_min === undefined ? null : g.trend_per_min / 60;
    const ahead = last && slope !== null ? last[1] + slope * FORECAST_S : null;
    const temps = [...h.map((p) => p[1]), ...(slow !== null ? [slow + 2] : []), ...(ahead !== null ? [ahead] : [])];
    const lo = Math.min(...temps, 30) - 2, hi = Math.max(...temps) + 2;
    const x = (t) => P + ((t - (now - WINDOW_S)) / (WINDOW_S + FORECAST_S)) * (W - 2 * P);
    const y = (c) => H - P - ((c - lo) / (hi - lo || 1)) * (H - 2 * P);
    el("line", { class: "now", x1: x(now), x2: x(now), y1: 0, y2: H }, svg);
    if (slow !== null) {
      el("line", { class: "slowdown", x1: 0, x2: W, y1: y(slow), y2: y(slow) }, svg);
      el("text", { class: "label", x: P, y: y(slow) - 2 }, svg).textContent = `slowdown ${fmt(slow, 0)} °C`;
    }
    for (const t of DECISION_TIMES) {
      if (t >= now - WINDOW_S) el("line", { class: "decision", x1: x(t), x2: x(t), y1: 0, y2: H }, svg);
    }
    if (h.length) {
      const pts = h.map(([t, c]) => `${x(t).toFixed(1)},${y(c).toFixed(1)}`).join(" ");
      el("polyline", { class: "temp", points: pts }, svg);
      el("circle", { class: "temp", cx: x(last[0]), cy: y(last[1]), r: 2.5 }, svg);
    }
    if (ahead !== null) {
      el("line", { class: "forecast", x1: x(last[0]), y1: y(last[1]), x2: x(last[0] + FORECAST_S), y2: y(ahead) }, svg);
    }
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
    const verb = item.kind === "override" ? `override ${item.action}` : item.action;
    const b = document.createElement("b");
    b.textContent = verb;
    li.append(`${clock(item.at)} `, b, ` ${item.node || ""} — ${d.reason || (item.override && item.override.reason) || ""}`);
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
  const [assess, state, caps] = await Promise.all([
    getJson("v1/assessments"),
    getJson("v1/state"),
    getJson("v1/power-caps"),
  ]);
  show(assess, state);
  renderCaps(caps);
}

function show(assess, state) {
  renderGpus(assess.gpus || []);
  const now = Date.now() / 1000;
  remember(assess.gpus || [], assess.at || now);
  renderCharts(assess.gpus || [], now);
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
