// Audit log: GET /api/v1/audit with the form's filters (kept in the URL).
import { api, fillTable, h, showError, when } from "./console.js";

const form = document.getElementById("filters");
const params = new URLSearchParams(location.search);
const query = new URLSearchParams({ limit: "100" });
for (const k of ["actor", "action", "since", "until"]) {
  const v = params.get(k);
  if (!v) continue;
  form.elements[k].value = v;
  query.set(k, k === "since" || k === "until" ? new Date(v).toISOString() : v);
}

const short = (v) => { const s = v ? JSON.stringify(v) : "–"; return s.length > 160 ? `${s.slice(0, 157)}…` : s; };

api(`/audit?${query}`).then((page) => fillTable(document.getElementById("entries"), page.data, (e) => h("tr", { "data-action": e.action },
  h("td", {}, when(e.time)), h("td", {}, e.actor), h("td", {}, e.action), h("td", {}, `${e.target_type} ${e.target_id}`),
  h("td", {}, h("code", {}, short(e.after)))), document.getElementById("no-entries"))).catch(showError);
