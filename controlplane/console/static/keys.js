// API keys (admin): create with a one-time display of the key, revoke with a confirmation.
import { api, confirmAction, fillTable, h, showError, when } from "./console.js";

async function refresh() {
  try {
    const page = await api("/keys?limit=200");
    fillTable(document.getElementById("keys"), page.data, (k) => h("tr", {},
      h("th", { scope: "row" }, k.name), h("td", {}, h("code", {}, k.prefix)), h("td", {}, k.role), h("td", {}, k.tenant ?? "all"),
      h("td", {}, when(k.created_at)), h("td", {}, when(k.last_used_at)), h("td", {}, when(k.revoked_at)),
      h("td", {}, k.revoked_at ? "" : h("button", { class: "danger", onclick: async () => {
        if (!(await confirmAction(`Revoke key ${k.name}? Clients using it are refused at once.`))) return;
        try { await api(`/keys/${k.id}`, { method: "DELETE" }); } catch (error) { showError(error); }
        refresh();
      } }, "Revoke"))));
  } catch (error) { showError(error); }
}

document.getElementById("create").addEventListener("submit", async (e) => {
  e.preventDefault();
  const f = e.target.elements;
  const body = { name: f.name.value.trim(), role: f.role.value };
  if (f.tenant.value.trim()) body.tenant = f.tenant.value.trim();
  try {
    const created = await api("/keys", { method: "POST", body });
    document.getElementById("secret").textContent = created.key;
    document.getElementById("created").hidden = false;
    showError(null);
    e.target.reset();
  } catch (error) { showError(error); }
  refresh();
});

refresh();
