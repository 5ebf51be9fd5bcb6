// Overview: every SLO's row from GET /api/v1/goodput/summary, then live over its SSE stream
// (changed rows only). The server computes status and order; this page only draws them.
import { api, h, num, pct, showError } from "./console.js";

const table = document.getElementById("slos");
const body = table.tBodies[0];
const live = document.getElementById("live");
const rows = new Map(); // slo_id -> <tr>
const params = new URLSearchParams(location.search);
const query = new URLSearchParams([...params].filter(([k, v]) => ["model", "tenant", "vantage"].includes(k) && v));
const filters = document.getElementById("filters");
for (const [k, v] of query) filters.elements[k].value = v;

function spark(values) {
  const max = Math.max(...values, 1e-9);
  const points = values.map((v, i) => `${(i * 100) / Math.max(values.length - 1, 1)},${20 - (v / max) * 18}`).join(" ");
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", "0 0 100 20");
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("class", "spark");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", `goodput per minute, last ${values.length} minutes, peak ${num(max)} per second`);
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points);
  svg.append(line);
  return svg;
}

const burnCell = (v) => h("td", { class: "num" }, num(v, 1));

function render(r) {
  const labels = [r.model ?? "any model", r.tenant ?? "any tenant", r.vantage].join(" · ");
  const tr = h("tr", { "data-slo": r.slo_id, "data-status": r.status, class: `status-${r.status}` },
    h("th", { scope: "row" }, h("span", { class: "dot", role: "img", title: r.status, "aria-label": r.status }),
      h("a", { href: `/console/slos/${encodeURIComponent(r.slo_id)}` }, r.slo_name)),
    h("td", {}, labels),
    h("td", { class: "num" }, num(r.goodput_rps)),
    h("td", { class: "num" }, num(r.throughput_rps)),
    h("td", { class: "num" }, `${pct(r.attainment_ratio, 2)} / ${pct(r.target, 2)}`),
    burnCell(r.burn_rate_1h), burnCell(r.burn_rate_6h),
    h("td", { class: "num" }, pct(r.error_budget_remaining_ratio)),
    h("td", { class: "num" }, pct(r.availability_ratio, 2)),
    h("td", {}, spark(r.spark)));
  const old = rows.get(r.slo_id);
  if (old) old.replaceWith(tr);
  rows.set(r.slo_id, tr);
  return tr;
}

function show(count, noData) {
  table.hidden = count === 0;
  document.getElementById("empty").hidden = count !== 0 || query.size !== 0;
  document.getElementById("no-traffic").hidden = count === 0 || !noData;
}

function apply(event) {
  if (event.full) { rows.clear(); body.replaceChildren(); }
  const fresh = event.rows.map(render);
  if (event.order) {
    const order = event.order.map((id) => rows.get(id)).filter(Boolean);
    for (const id of [...rows.keys()]) if (!event.order.includes(id)) rows.delete(id);
    body.replaceChildren(...order);
  } else if (event.full) body.append(...fresh);
  const all = [...rows.values()];
  show(all.length, all.every((tr) => tr.dataset.status === "no_data"));
  live.textContent = `live · ${new Date(event.time * 1000).toLocaleTimeString()}`;
  document.body.dataset.painted = String(event.time);
}

async function start() {
  try {
    const first = await api(`/goodput/summary?${query}`);
    apply({ time: first.time, rows: first.data, order: first.data.map((r) => r.slo_id), full: true });
  } catch (error) {
    showError(error);
  }
  const stream = new EventSource(`/api/v1/goodput/summary/stream?${query}`);
  stream.addEventListener("summary", (e) => {
    const received = performance.now();
    showError(null);
    apply(JSON.parse(e.data));
    // Update-to-paint time, readable with performance.getEntriesByName("sse-to-paint").
    requestAnimationFrame(() => performance.measure("sse-to-paint", { start: received }));
  });
  stream.onerror = () => { live.textContent = "reconnecting…"; };
}

start();
