// SLO editor: create / edit / delete through /api/v1/slos, the API's 422 messages shown
// beside the field they name, a dry run (POST /slos:dry-run) and OpenSLO import.
import { ApiError, api, confirmAction, h, pct, showError } from "./console.js";

const form = document.getElementById("editor");
const ref = form.dataset.ref;
const el = form.elements;
let objectiveFields = []; // index in the body's objectives -> its input

function text(name) { return el[name].value.trim(); }
function number(name) { const v = text(name); return v === "" ? undefined : Number(v); }

// The body as the API takes it; a value the API will refuse is sent as typed, so that the
// API's own message names it.
function body() {
  const selector = {};
  for (const k of ["model", "tenant", "priority"]) if (text(`selector.${k}`)) selector[k] = text(`selector.${k}`);
  objectiveFields = [];
  const objectives = [];
  for (const row of form.querySelectorAll(".objective")) {
    const metric = row.dataset.metric;
    const raw = el[metric].value.trim();
    if (raw === "") continue;
    const o = { metric, threshold_s: Number.isNaN(Number(raw)) ? raw : Number(raw) };
    if (metric === "itl") o.statistic = text("itl_statistic") || "max";
    objectives.push(o);
    objectiveFields.push(el[metric]);
  }
  const b = { name: text("name"), description: text("description"), selector, objectives,
    target: number("target") ?? null, window_s: number("window_s"), vantage: el.vantage.value,
    infeasible: el.infeasible.value };
  const avail = number("availability_target");
  if (avail !== undefined || ref) b.availability_target = avail ?? null;
  return b;
}

function clearErrors() {
  for (const e of form.querySelectorAll(".field-error")) e.remove();
  for (const i of form.querySelectorAll("[aria-invalid]")) { i.removeAttribute("aria-invalid"); i.removeAttribute("aria-describedby"); }
  showError(null);
}

function fieldInput(field) {
  const m = /^(?:slo\.)?objectives\.(\d+)/.exec(field);
  if (m) return objectiveFields[Number(m[1])];
  return form.querySelector(`[data-field="${field.replace(/^slo\./, "")}"]`);
}

// Show the API's errors: each 422 entry beside its field (else in the page's alert).
function showErrors(error) {
  if (!(error instanceof ApiError) || !Array.isArray(error.detail)) return showError(error);
  const unplaced = [];
  error.detail.forEach((d, i) => {
    const input = fieldInput(d.field ?? "");
    if (!input) { unplaced.push(d.msg); return; }
    const id = `err-${i}`;
    input.setAttribute("aria-invalid", "true");
    input.setAttribute("aria-describedby", id);
    input.closest("label").after(h("p", { class: "field-error", id, role: "alert" }, d.msg));
  });
  if (unplaced.length) showError(new Error(unplaced.join("; ")));
}

async function fill() {
  const slo = await api(`/slos/${ref}`);
  for (const k of ["name", "description", "target", "window_s", "vantage", "infeasible", "availability_target"]) el[k].value = slo[k] ?? "";
  for (const [k, v] of Object.entries(slo.selector)) if (el[`selector.${k}`]) el[`selector.${k}`].value = v;
  for (const o of slo.objectives) {
    el[o.metric].value = o.threshold_s;
    if (o.metric === "itl") el.itl_statistic.value = o.statistic;
  }
  return slo;
}

form.addEventListener("submit", async (e) => {
  e.preventDefault();
  clearErrors();
  try {
    const saved = ref ? await api(`/slos/${ref}`, { method: "PATCH", body: body() })
      : await api("/slos", { method: "POST", body: body() });
    location.assign(`/console/slos/${saved.id}`);
  } catch (error) { showErrors(error); }
});

document.getElementById("dry-run").addEventListener("click", async () => {
  clearErrors();
  const out = document.getElementById("dry-result");
  out.textContent = "running…";
  try {
    const candidate = body();
    if (ref && candidate.availability_target === null) delete candidate.availability_target;
    const dry = await api("/slos:dry-run", { method: "POST", body: { slo: candidate, window_s: 3600 } });
    let now = "";
    if (ref) {
      const current = await api(`/slos/${ref}/goodput?window=1h`);
      now = ` instead of ${pct(current.attainment_ratio)} with the saved version`;
    }
    out.textContent = dry.requests === 0 ? "No request in the last hour matches this selector."
      : `Over the last hour this SLO would have been ${pct(dry.attainment_ratio)}${now} ` +
        `(${dry.good} good of ${dry.requests} judged; burn rate ${dry.burn_rate?.toFixed(2) ?? "–"}).`;
  } catch (error) { out.textContent = ""; showErrors(error); }
});

document.getElementById("delete")?.addEventListener("click", async () => {
  if (!(await confirmAction(`Delete SLO ${text("name")}? Its history stays; the name becomes free.`))) return;
  try { await api(`/slos/${ref}`, { method: "DELETE" }); location.assign("/console/"); } catch (error) { showError(error); }
});

document.getElementById("import").addEventListener("submit", async (e) => {
  e.preventDefault();
  const out = document.getElementById("import-result");
  try {
    const result = await api("/slos:import", { method: "POST", body: document.getElementById("yaml").value, raw: true, type: "application/yaml" });
    out.replaceChildren(...result.data.map((a) => h("span", {}, `${a.action} `, h("a", { href: `/console/slos/${a.slo.id}` }, a.slo.name), ". ")));
  } catch (error) { out.textContent = error.message; }
});

if (ref) fill().catch(showError);
