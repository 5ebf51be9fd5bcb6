// Overview: every SLO's row from GET /api/v1/goodput/summary, then live over its SSE stream,
// which starts from the rows this page holds (?since=) and sends only the rows that changed.
// The server computes status and order; this page only draws them. Rows are built once per
// SLO; an update rewrites only the cells whose text changed and moves only misplaced rows.
import { api, num, pct, showError } from "./console.js";

const table = document.getElementById("slos");
const body = table.tBodies[0];
const live = document.getElementById("live");
const rows = new Map(); // slo_id -> {tr, cells, line, status, spark}
const params = new URLSearchParams(location.search);
const query = new URLSearchParams([...params].filter(([k, v]) => ["model", "tenant", "vantage"].includes(k) && v));
const filters = document.getElementById("filters");
for (const [k, v] of query) filters.elements[k].value = v;

const SVG = "http://www.w3.org/2000/svg";
// Each cell's text from a row; the order is the table's columns after the first two.
const CELLS = [
  (r) => num(r.goodput_rps),
  (r) => num(r.throughput_rps),
  (r) => `${pct(r.attainment_ratio, 2)} / ${pct(r.target, 2)}`,
  (r) => num(r.burn_rate_1h, 1),
  (r) => num(r.burn_rate_6h, 1),
  (r) => pct(r.error_budget_remaining_ratio),
  (r) => pct(r.availability_ratio, 2),
];

// One row's elements, cloned from a template built once.
const template = (() => {
  const tr = document.createElement("tr");
  tr.setAttribute("role", "row"); // rows are grids (console.css): keep the table's semantics
  const th = document.createElement("th");
  th.scope = "row";
  th.setAttribute("role", "rowheader");
  const dot = document.createElement("span");
  dot.className = "dot";
  dot.setAttribute("role", "img");
  th.append(dot, document.createElement("a"));
  const cell = (className) => {
    const td = document.createElement("td");
    td.setAttribute("role", "cell");
    if (className) td.className = className;
    return td;
  };
  tr.append(th, cell());
  for (let i = 0; i < CELLS.length; i++) tr.append(cell("num"));
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", "0 0 100 20");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("class", "spark");
  svg.setAttribute("role", "img");
  svg.append(document.createElementNS(SVG, "polyline"));
  const td = cell();
  td.append(svg);
  tr.append(td);
  return tr;
})();

function create(r) {
  const tr = template.cloneNode(true);
  tr.dataset.slo = r.slo_id;
  const [th, labels, ...rest] = tr.children;
  const link = th.lastChild;
  link.href = `/console/slos/${encodeURIComponent(r.slo_id)}`;
  link.textContent = r.slo_name;
  labels.textContent = labels.title = [r.model ?? "any model", r.tenant ?? "any tenant", r.vantage].join(" · ");
  const spark = rest.pop();
  const entry = { tr, dot: th.firstChild, cells: rest, texts: [], svg: spark.firstChild, status: "", spark: "" };
  rows.set(r.slo_id, entry);
  return entry;
}

function sparkPoints(values) {
  const max = Math.max(...values, 1e-9);
  const step = 100 / Math.max(values.length - 1, 1);
  return [max, values.map((v, i) => `${(i * step).toFixed(1)},${(20 - (v / max) * 18).toFixed(1)}`).join(" ")];
}

// Write only what changed since the row was last drawn.
function update(r) {
  const entry = rows.get(r.slo_id) ?? create(r);
  if (entry.status !== r.status) {
    entry.status = r.status;
    entry.tr.dataset.status = r.status;
    entry.tr.className = `status-${r.status}`;
    entry.dot.title = r.status;
    entry.dot.setAttribute("aria-label", r.status);
  }
  for (let i = 0; i < CELLS.length; i++) {
    const text = CELLS[i](r);
    if (entry.texts[i] !== text) {
      entry.texts[i] = text;
      entry.cells[i].textContent = text;
    }
  }
  const key = r.spark.join(",");
  if (entry.spark !== key) {
    entry.spark = key;
    const [max, points] = sparkPoints(r.spark);
    entry.svg.firstChild.setAttribute("points", points);
    entry.svg.setAttribute("aria-label", `goodput per minute, last ${r.spark.length} minutes, peak ${num(max)} per second`);
  }
  return entry;
}

// Put the rows in ``order``, moving only those out of place; drop rows no longer listed.
function reorder(order) {
  const wanted = new Set(order);
  for (const [id, entry] of rows) {
    if (!wanted.has(id)) { entry.tr.remove(); rows.delete(id); }
  }
  if (!body.firstChild) {
    const fragment = document.createDocumentFragment();
    for (const id of order) fragment.append(rows.get(id).tr);
    body.append(fragment);
    return;
  }
  let at = body.firstChild;
  for (const id of order) {
    const tr = rows.get(id)?.tr;
    if (!tr) continue;
    if (tr === at) at = at.nextSibling;
    else body.insertBefore(tr, at);
  }
}

function show(count) {
  table.hidden = count === 0;
  document.getElementById("empty").hidden = count !== 0 || query.size !== 0;
  let noData = count !== 0;
  for (const entry of rows.values()) if (entry.status !== "no_data") { noData = false; break; }
  document.getElementById("no-traffic").hidden = !noData;
}

function apply(event) {
  if (event.full) { rows.clear(); body.replaceChildren(); }
  for (const r of event.rows) update(r);
  if (event.order) reorder(event.order);
  show(rows.size);
  live.textContent = `live · ${new Date(event.time * 1000).toLocaleTimeString()}`;
  document.body.dataset.painted = String(event.time);
}

function listen(since) {
  const args = new URLSearchParams(query);
  if (since !== null) args.set("since", String(since));
  const stream = new EventSource(`/api/v1/goodput/summary/stream?${args}`);
  stream.addEventListener("summary", (e) => {
    const received = performance.now();
    showError(null);
    apply(JSON.parse(e.data));
    // Update-to-paint time, readable with performance.getEntriesByName("sse-to-paint").
    requestAnimationFrame(() => performance.measure("sse-to-paint", { start: received }));
  });
  stream.onerror = () => { live.textContent = "reconnecting…"; };
}

async function start() {
  let since = null;
  try {
    const first = await api(`/goodput/summary?${query}`);
    performance.mark("summary-read");
    apply({ time: first.time, rows: first.data, order: first.data.map((r) => r.slo_id), full: true });
    since = first.time;
    performance.mark("rows-drawn"); // the overview is complete: the benchmark reads this
  } catch (error) {
    showError(error);
  }
  listen(since);
}

start();
