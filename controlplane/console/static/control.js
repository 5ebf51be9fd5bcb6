// Control: the admission policy in force, the policies issued (decisions) and the planner's
// moves with their predicted and observed effects, newest first on one time axis.
import { api, fillTable, h, ms, num, showError, when } from "./console.js";

const compact = (obj) => Object.entries(obj ?? {}).map(([k, v]) =>
  `${k}: ${typeof v === "number" ? num(v, 3) : typeof v === "object" ? JSON.stringify(v) : v}`).join(", ") || "–";

function classes(policy) {
  return Object.entries(policy?.classes ?? {}).map(([name, c]) =>
    `${name} (${c.shed_order} · ${ms(c.ttft_s)} · ${num(c.headroom_ratio)})`).join("; ") || "–";
}
function slos(policy) {
  return Object.entries(policy?.slos ?? {}).map(([name, s]) => `${name}: ${num(s.burn_rate)} → ${num(s.margin_ratio)}`).join("; ") || "–";
}

async function load() {
  try {
    const [decisions, moves] = await Promise.all([
      api("/commands?kind=set_admission_policy&limit=50"), api("/automation/moves?limit=50")]);
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
    fillTable(document.getElementById("decisions"), decisions.data, (c) => h("tr", {},
      h("td", {}, when(c.created_at)), h("td", {}, c.target), h("td", {}, String(c.payload.policy?.version ?? c.version)),
      h("td", {}, c.state), h("td", {}, classes(c.payload.policy)), h("td", {}, slos(c.payload.policy)),
      h("td", {}, c.ack ? `${c.ack.ok ? "ok" : "failed"} ${c.ack.detail}` : "–")));
    fillTable(document.getElementById("moves"), moves.data, (m) => h("tr", {},
      h("td", {}, when(m.created_at)), h("td", {}, m.member_id), h("td", {}, `${m.from_role} → ${m.to_role}`),
      h("td", {}, m.source), h("td", {}, m.state), h("td", {}, compact(m.predicted_effect)),
      h("td", {}, m.observed_effect ? compact(m.observed_effect) : m.observe_at ? `due ${when(m.observe_at)}` : "–")),
      document.getElementById("no-moves"));
  } catch (error) { showError(error); }
}

load();
setInterval(load, 5000);
