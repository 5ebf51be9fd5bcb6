// Fleet: members, commands and the planner's switch; operators drain, resume, move and pin
// (each with a confirmation) through the same API as any client.
import { ago, api, canOperate, confirmAction, fillTable, h, pct, showError, when } from "./console.js";

const operate = canOperate();
const pausable = document.getElementById("pause") !== null;  // cluster keys only (fleet.html)

async function act(question, path, body, method = "POST") {
  if (!(await confirmAction(question))) return;
  try { await api(path, { method, body }); showError(null); } catch (error) { showError(error); }
  await refresh();
}

function actions(m, pinned) {
  const id = m.id;
  const buttons = [
    h("button", { onclick: () => act(`Drain ${id}? It finishes its requests and takes no new ones.`, "/commands", { target: id, kind: "drain" }) }, "Drain"),
    h("button", { onclick: () => act(`Resume ${id}?`, "/commands", { target: id, kind: "resume" }) }, "Resume"),
  ];
  if (m.kind === "worker") {
    const to = m.role === "prefill" ? "decode" : "prefill";
    buttons.push(h("button", { onclick: () => act(`Move ${id} to the ${to} pool (drain, switch role, resume)?`, "/automation/moves", { member_id: id, role: to }) }, `Move to ${to}`));
    buttons.push(pinned
      ? h("button", { onclick: () => act(`Unpin ${id}? The planner may move it again.`, `/automation/pins/${encodeURIComponent(id)}`, undefined, "DELETE") }, "Unpin")
      : h("button", { onclick: () => act(`Pin ${id} to role ${m.role}? The planner will not move it.`, `/automation/pins/${encodeURIComponent(id)}`, { role: m.role, reason: "pinned from the console" }, "PUT") }, "Pin"));
  }
  return h("td", { class: "actions" }, buttons);
}

function evidence(c) {
  if (c.ack) return `${c.ack.ok ? "ok" : "failed"}: ${c.ack.detail || "no detail"}`;
  if (c.kind === "set_admission_policy") return `policy v${c.payload?.policy?.version ?? "?"}`;
  return "";
}

async function refresh() {
  try {
    const [members, commands, automation] = await Promise.all([
      api("/fleet?limit=500"), api("/commands?limit=50"), api("/automation")]);
    const pins = new Map(automation.pins.map((p) => [p.member_id, p]));
    fillTable(document.getElementById("members"), members.data, (m) => h("tr", { "data-member": m.id, class: m.stale ? "stale" : "" },
      h("th", { scope: "row" }, m.id), h("td", {}, m.kind), h("td", {}, m.model || "–"),
      h("td", {}, m.tenant ?? "shared"), h("td", {}, m.role),
      h("td", {}, m.stale ? `${m.state} (stale)` : m.state),
      h("td", { class: "num" }, String(m.load.num_requests_running ?? "–")),
      h("td", { class: "num" }, String(m.load.num_requests_waiting ?? "–")),
      h("td", { class: "num" }, m.load.kv_cache_usage_ratio === undefined ? "–" : pct(m.load.kv_cache_usage_ratio)),
      h("td", {}, ago(m.last_heartbeat_at)),
      h("td", {}, pins.has(m.id) ? `${pins.get(m.id).role}` : "–"),
      operate ? actions(m, pins.has(m.id)) : null), document.getElementById("no-members"));
    fillTable(document.getElementById("commands"), commands.data, (c) => h("tr", { "data-command": c.id, "data-state": c.state },
      h("td", {}, when(c.created_at)), h("td", {}, c.target), h("td", {}, c.kind), h("td", {}, c.state),
      h("td", { class: "num" }, String(c.attempts)), h("td", {}, when(c.delivered_at)), h("td", {}, when(c.acked_at)),
      h("td", {}, evidence(c))), document.getElementById("no-commands"));
    const planner = automation.planner;
    document.getElementById("planner").textContent = `automation ${planner.paused ? `paused (${planner.reason || "no reason"})` : "running"}` +
      `${automation.enabled ? "" : " · planner off in this process"} · ${automation.open_moves} move(s) open`;
    if (pausable) {
      document.getElementById("pause").hidden = planner.paused;
      document.getElementById("resume").hidden = !planner.paused;
    }
  } catch (error) { showError(error); }
}

if (pausable) {
  document.getElementById("pause").addEventListener("click", () => act("Pause the planner? It issues no command until resumed.", "/automation/pause", { reason: "paused from the console" }));
  document.getElementById("resume").addEventListener("click", () => act("Resume the planner?", "/automation/resume", { reason: "" }));
}
refresh();
setInterval(refresh, 2000);
