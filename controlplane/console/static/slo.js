// SLO detail: charts from GET /slos/{ref}/goodput/series, version history with a diff.
import { api, fillTable, h, ms, pct, showError, when } from "./console.js";

const ref = document.querySelector(".charts").dataset.ref;
const range = new URLSearchParams(location.search).get("range") ?? "1h";
document.querySelector(`[data-range="${range}"]`)?.setAttribute("aria-current", "page");
const charts = [];
const COLORS = ["#1f6feb", "#8250df", "#cf222e", "#1a7f37", "#9a6700", "#57606a", "#bf3989", "#0a7ea4", "#6639ba", "#116329"];

function chart(id, data, series, yFormat = (v) => v) {
  const el = document.getElementById(id);
  const opts = {
    width: el.clientWidth || 640, height: 200,
    scales: { x: { time: true } },
    // Points too: a step with requests between empty steps is a point, not a line.
    series: [{}, ...series.map((s, i) => ({ stroke: COLORS[i], width: 1.5, spanGaps: false, points: { show: true, size: 4 }, ...s }))],
    axes: [{}, { values: (u, vals) => vals.map(yFormat), size: 84 }],
    legend: { live: true },
  };
  charts.push(new uPlot(opts, data, el));
  // What was drawn, for the browser tests: values (not null) per series label.
  el.dataset.points = JSON.stringify(Object.fromEntries(series.map((s, i) =>
    [s.label, data[i + 1].filter((v) => v !== null && v !== undefined).length])));
}

const METRICS = ["ttft", "tpot", "itl", "e2el"];
const className = (name) => (name === "" ? "no class" : name);

const flat = (obj, prefix = "") => Object.entries(obj ?? {}).flatMap(([k, v]) =>
  v && typeof v === "object" && !Array.isArray(v) ? flat(v, `${prefix}${k}.`)
    : [[`${prefix}${k}`, JSON.stringify(v)]]);
const IGNORED = new Set(["version", "updated_at", "created_at", "deleted_at", "id"]);

function diff(prev, next) {
  if (!prev) return h("span", {}, "created");
  const a = new Map(flat(prev)), b = new Map(flat(next));
  const keys = [...new Set([...a.keys(), ...b.keys()])].filter((k) => !IGNORED.has(k) && a.get(k) !== b.get(k));
  if (!keys.length) return h("span", {}, "no field changed");
  return h("ul", { class: "diff" }, keys.map((k) => h("li", {}, h("code", {}, k), " ",
    h("del", {}, a.get(k) ?? "—"), " → ", h("ins", {}, b.get(k) ?? "—"))));
}

async function load() {
  try {
    const [slo, s, versions] = await Promise.all([
      api(`/slos/${ref}`), api(`/slos/${ref}/goodput/series?range=${range}`), api(`/slos/${ref}/versions`),
    ]);
    document.getElementById("name").textContent = slo.name;
    document.title = `${slo.name} · Goodput`;
    const objectives = slo.objectives.map((o) => `${o.metric}${o.statistic !== "max" ? " " + o.statistic : ""} ≤ ${ms(o.threshold_s)}`).join(", ");
    document.getElementById("summary").textContent =
      `${pct(slo.target, 2)} of requests (${slo.vantage} vantage, ${Object.entries(slo.selector).map(([k, v]) => `${k}=${v}`).join(", ") || "all requests"}) ` +
      `with ${objectives}, over ${(slo.window_s / 86400).toFixed(slo.window_s % 86400 ? 2 : 0)} days; ` +
      `infeasible requests ${slo.infeasible === "reject" ? "rejected" : "admitted (best effort)"}. Version ${slo.version}; step ${s.step_s} s.`;
    const c = s.columns, t = c.time;
    chart("c-rate", [t, c.goodput_rps, c.throughput_rps], [{ label: "goodput" }, { label: "throughput" }]);
    chart("c-attain", [t, c.attainment_ratio, t.map(() => slo.target)], [{ label: "attainment" }, { label: "target", dash: [4, 4] }], (v) => pct(v));
    chart("c-burn", [t, c.burn_rate_5m, c.burn_rate_1h, c.burn_rate_6h], [{ label: "5 min" }, { label: "1 h" }, { label: "6 h" }]);
    chart("c-budget", [t, c.error_budget_remaining_ratio], [{ label: "budget left", fill: "rgba(31,111,235,.1)" }], (v) => pct(v, 0));
    // One chart per vantage, the SLO's own first: the same selector's OK requests there.
    const other = slo.vantage === "gateway" ? "engine" : "gateway";
    [slo.vantage, other].forEach((vantage, i) => {
      const p = s.percentiles_by_vantage[vantage] ?? {};
      document.getElementById(`lat-caption-${i}`).textContent = i === 0
        ? `TTFT, TPOT, ITL and E2EL p50 / p99 at the ${vantage} vantage, where this SLO judges requests`
        : `TTFT, TPOT, ITL and E2EL p50 / p99 at the ${vantage} vantage: the same selector's successful requests, not judged`;
      const lat = METRICS.flatMap((m) => [[`${vantage} ${m} p50`, p[`${m}_p50_s`]], [`${vantage} ${m} p99`, p[`${m}_p99_s`]]]);
      chart(`c-lat-${i}`, [t, ...lat.map((l) => l[1] ?? t.map(() => null))], lat.map((l) => ({ label: l[0], value: (u, v) => ms(v) })), ms);
    });
    // One series per priority class, then all classes together and the availability.
    const classes = Object.entries(s.rejected_by_class).sort(([a], [b]) => a.localeCompare(b)).slice(0, COLORS.length - 2);
    chart("c-rej", [t, ...classes.map(([, v]) => v), c.rejected, c.availability_ratio],
      [...classes.map(([name]) => ({ label: className(name) })),
        { label: "all classes", dash: [4, 4] }, { label: "availability", scale: "ratio" }]);
    const rows = versions.data;
    fillTable(document.getElementById("versions"), rows, (v, i) => h("tr", {},
      h("td", {}, String(v.version)), h("td", {}, when(v.created_at)), h("td", {}, v.actor),
      h("td", {}, diff(rows[i + 1]?.snapshot, v.snapshot))));
  } catch (error) {
    showError(error);
  }
}

load();
