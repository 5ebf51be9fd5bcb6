// Control: the admission policy in force, then one time axis: an SLO's goodput over the last
// 5 minutes, hour or day with the admission decisions (A1, A2, …) and planner moves (M1, …)
// as markers, each move's predicted and observed goodput as dots; the tables below carry the
// same labels.
import { api, fillTable, h, ms, num, showError, when } from "./console.js";

const select = document.getElementById("slo");
const rangeSelect = document.getElementById("range");
const chartEl = document.getElementById("c-control");
const COLORS = { goodput: "#1f6feb", throughput: "#8c959f", decision: "#8250df", move: "#bc4c00" };
let chart = null;
let marks = { decisions: [], moves: [] }; // drawn by the chart's draw hook

const compact = (obj) => Object.entries(obj ?? {}).map(([k, v]) =>
  `${k}: ${typeof v === "number" ? num(v, 3) : typeof v === "object" ? JSON.stringify(v) : v}`).join(", ") || "–";
const seconds = (iso) => (iso ? new Date(iso).getTime() / 1000 : null);

function classes(policy) {
  return Object.entries(policy?.classes ?? {}).map(([name, c]) =>
    `${name} (${c.shed_order} · ${ms(c.ttft_s)} · ${num(c.headroom_ratio)})`).join("; ") || "–";
}
function slos(policy) {
  return Object.entries(policy?.slos ?? {}).map(([name, s]) => `${name}: ${num(s.burn_rate)} → ${num(s.margin_ratio)}`).join("; ") || "–";
}
function observed(m) {
  if (m.observed_effect) {
    const o = m.observed_effect;
    return `goodput ${num(o.observed_goodput_rps)}/s (predicted ${num(o.predicted_goodput_rps)}/s); ${compact({ pools: o.pools })}`;
  }
  return m.observe_at ? `due ${when(m.observe_at)}` : "–";
}

// Vertical lines with their labels, and the moves' predicted (hollow) and observed dots.
function drawMarks(u) {
  const { ctx } = u;
  const [x0, x1] = [u.scales.x.min, u.scales.x.max];
  const top = u.bbox.top, bottom = u.bbox.top + u.bbox.height;
  ctx.save();
  ctx.font = `${11 * devicePixelRatio}px system-ui, sans-serif`;
  const labelled = [-Infinity, -Infinity]; // x of the last label drawn, per kind
  const line = (t, color, label, kind) => {
    if (t === null || t < x0 || t > x1) return;
    const x = u.valToPos(t, "x", true);
    ctx.strokeStyle = ctx.fillStyle = color;
    ctx.lineWidth = devicePixelRatio;
    ctx.setLineDash([4 * devicePixelRatio, 3 * devicePixelRatio]);
    ctx.beginPath(); ctx.moveTo(x, top); ctx.lineTo(x, bottom); ctx.stroke();
    // Markers closer than a label's width share the first label (newest first: the latest).
    if (Math.abs(labelled[kind] - x) < 28 * devicePixelRatio) return;
    labelled[kind] = x;
    ctx.fillText(label, x + 3 * devicePixelRatio, top + (12 + kind * 13) * devicePixelRatio);
  };
  const dot = (t, v, color, filled) => {
    if (t === null || v === null || v === undefined || t < x0 || t > x1) return;
    const x = u.valToPos(t, "x", true), y = u.valToPos(v, "y", true);
    ctx.setLineDash([]);
    ctx.strokeStyle = ctx.fillStyle = color;
    ctx.beginPath(); ctx.arc(x, y, 4 * devicePixelRatio, 0, 2 * Math.PI);
    if (filled) ctx.fill(); else ctx.stroke();
  };
  marks.decisions.forEach((d) => line(d.t, COLORS.decision, d.label, 0));
  marks.moves.forEach((m) => {
    line(m.t, COLORS.move, m.label, 1);
    dot(m.predictedAt, m.predicted, COLORS.move, false);
    dot(m.observedAt, m.observed, COLORS.move, true);
  });
  ctx.restore();
}

function draw(series) {
  const c = series.columns;
  const data = [c.time, c.goodput_rps, c.throughput_rps];
  if (chart) { chart.setData(data); return; }
  chart = new uPlot({
    width: chartEl.clientWidth || 1200, height: 240,
    scales: { x: { time: true } },
    series: [{}, { label: "goodput", stroke: COLORS.goodput, width: 1.5 },
      { label: "throughput", stroke: COLORS.throughput, width: 1, dash: [4, 4] }],
    axes: [{}, { size: 60 }],
    hooks: { draw: [drawMarks] },
  }, data, chartEl);
}

async function loadSlos() {
  const found = await api("/slos?limit=200");
  const params = new URLSearchParams(location.search);
  const wanted = params.get("slo");
  select.replaceChildren(...found.data.map((s) => h("option", { value: s.id, selected: s.id === wanted }, s.name)));
  if ([...rangeSelect.options].some((o) => o.value === params.get("range"))) rangeSelect.value = params.get("range");
  document.getElementById("no-slo").hidden = found.data.length !== 0;
  const changed = () => {
    history.replaceState(null, "", `?${new URLSearchParams({ slo: select.value, range: rangeSelect.value })}`);
    chart?.destroy(); chart = null; load();
  };
  select.addEventListener("change", changed);
  rangeSelect.addEventListener("change", changed);
}

async function load() {
  try {
    const ref = select.value;
    const [decisions, moves, series] = await Promise.all([
      api("/commands?kind=set_admission_policy&limit=50"), api("/automation/moves?limit=50"),
      ref ? api(`/slos/${encodeURIComponent(ref)}/goodput/series?range=${rangeSelect.value}`) : null]);
    const latest = decisions.data[0];
    if (latest) {
      const p = latest.payload.policy;
      const expired = latest.expires_at && new Date(latest.expires_at) < new Date();
      document.getElementById("policy").replaceChildren(h("dl", { class: "facts" },
        h("dt", {}, "Version"), h("dd", {}, String(p.version)),
        h("dt", {}, "Issued"), h("dd", {}, when(latest.created_at)),
        h("dt", {}, "TTL"), h("dd", {}, `${p.ttl_s} s`),
        h("dt", {}, "Fail-open"), h("dd", {}, expired
          ? `expired at ${when(latest.expires_at)}: gateways fall back to ${p.fallback_max_concurrency} concurrent requests`
          : `in force; on expiry gateways fall back to ${p.fallback_max_concurrency} concurrent requests`),
        h("dt", {}, "Classes"), h("dd", {}, classes(p)),
        h("dt", {}, "SLOs"), h("dd", {}, slos(p))));
    }
    // Oldest first get the lowest numbers, so a label stays with its row as new ones arrive.
    const label = (prefix, list, i) => `${prefix}${list.length - i}`;
    marks = {
      decisions: decisions.data.map((c, i) => ({ t: seconds(c.created_at), label: label("A", decisions.data, i) })),
      moves: moves.data.map((m, i) => ({
        t: seconds(m.created_at), label: label("M", moves.data, i),
        predictedAt: seconds(m.observe_at ?? m.created_at), predicted: m.predicted_effect?.after?.goodput_rps ?? null,
        observedAt: seconds(m.observed_effect?.time), observed: m.observed_effect?.observed_goodput_rps ?? null,
      })),
    };
    if (series) draw(series);
    fillTable(document.getElementById("decisions"), decisions.data, (c, i) => h("tr", {},
      h("td", {}, label("A", decisions.data, i)),
      h("td", {}, when(c.created_at)), h("td", {}, c.target), h("td", {}, String(c.payload.policy?.version ?? c.version)),
      h("td", {}, c.state), h("td", {}, classes(c.payload.policy)), h("td", {}, slos(c.payload.policy)),
      h("td", {}, c.ack ? `${c.ack.ok ? "ok" : "failed"} ${c.ack.detail}` : "–")),
      document.getElementById("no-decisions"));
    fillTable(document.getElementById("moves"), moves.data, (m, i) => h("tr", {},
      h("td", {}, label("M", moves.data, i)),
      h("td", {}, when(m.created_at)), h("td", {}, m.member_id), h("td", {}, `${m.from_role} → ${m.to_role}`),
      h("td", {}, m.source), h("td", {}, m.state), h("td", {}, compact(m.predicted_effect)),
      h("td", {}, observed(m))),
      document.getElementById("no-moves"));
  } catch (error) { showError(error); }
}

loadSlos().then(load, showError);
setInterval(load, 5000);
