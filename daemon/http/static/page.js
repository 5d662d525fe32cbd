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
    cell(row, `${what} ${s.labels.probe || s.sensor}`);
    cell(row, s.value === null ? `BAD: ${s.reason}` : `${fmt(s.value)} ${s.unit}`);
    cell(row, s.quality === "good" ? "" : s.quality);
  }
}

function renderRack(rack) {
  $("rack-detail").textContent = rack ? rack.detail || rack.condition : "no rack evidence (no PDU or CDU source)";
}

const seen = new Set();

function addDecision(d, prepend) {
  const id = d.key || `${d.kind}-${d.id}`;
  if (seen.has(id)) return;
  seen.add(id);
  const li = document.createElement("li");
  li.dataset.action = d.action || "";
  const when = new Date((d.at || Date.now() / 1000) * 1000).toLocaleTimeString();
  const verb = d.kind === "override" ? `override ${d.action}` : d.action;
  const b = document.createElement("b");
  b.textContent = verb;
  li.append(`${when} `, b, ` ${d.node || ""} — ${d.reason || (d.override && d.override.reason) || ""}`);
  const list = $("timeline");
  if (prepend) list.prepend(li); else list.append(li);
}

function renderAction(action) {
  const badge = $("action");
  badge.dataset.action = action;
  badge.textContent = { drain: "drained", exclude: "excluded", resume: "in service" }[action] || action;
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
  renderGpus(assess.gpus || []);
  renderRack(assess.rack);
  renderState(state);
  renderCaps(caps);
}

async function loadTimeline() {
  const log = await getJson("v1/decisions?limit=50");
  const items = log.items || [];
  for (const item of items) addDecision({ ...item, ...(item.decision || {}) }, false);
  const last = items.find((i) => i.kind === "decision");
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
  events.addEventListener("decision", (e) => {
    const d = JSON.parse(e.data);
    addDecision(d, true);
    renderAction(d.action);
    bump();
  });
  for (const kind of ["assessment", "delivery", "override", "power_cap"]) events.addEventListener(kind, bump);
}

async function main() {
  listen();
  await Promise.all([refresh(), loadTimeline()]).catch((err) => {
    $("live").textContent = String(err);
  });
  // Temperatures change between events: a light poll keeps the table current.
  setInterval(() => refresh().catch(() => {}), 2000);
}

main();
