// Shared helpers of the console's pages: API calls with the session cookie and CSRF token,
// element building, number formatting. No business rule lives here: the API decides.

const csrf = document.querySelector('meta[name="csrf-token"]')?.content ?? "";

export class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : detail.map((d) => d.msg).join("; "));
    this.status = status;
    this.detail = detail; // the API's text, or its 422 list of {field, msg}
  }
}

// fetch /api/v1{path}; JSON in and out; throws ApiError with the API's own error text.
export async function api(path, { method = "GET", body, raw = false, type } = {}) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") headers["X-CSRF-Token"] = csrf;
  let payload = body;
  if (body !== undefined && !raw) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  } else if (type) headers["Content-Type"] = type;
  const response = await fetch(`/api/v1${path}`, { method, headers, body: payload, credentials: "same-origin" });
  if (response.status === 401) location.assign(`/console/sign-in?next=${encodeURIComponent(location.pathname)}`);
  const text = await response.text();
  const data = text && (response.headers.get("content-type") ?? "").includes("json") ? JSON.parse(text) : text;
  if (!response.ok) throw new ApiError(response.status, data?.detail ?? `${response.status} ${response.statusText}`);
  return data;
}

// h("td", {class: "num"}, "1.2") -> element; attributes starting with "on" are listeners.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  el.append(...children.flat().filter((c) => c !== undefined && c !== null));
  return el;
}

export const pct = (r, digits = 1) => (r === null || r === undefined ? "–" : `${(r * 100).toFixed(digits)} %`);
export const num = (v, digits = 2) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));
export const ms = (s) => (s === null || s === undefined ? "–" : `${(s * 1000).toFixed(s < 0.01 ? 2 : 0)} ms`);
export const when = (iso) => (iso ? new Date(iso).toLocaleString() : "–");
export function ago(iso) {
  if (!iso) return "never";
  const s = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  return s < 90 ? `${s.toFixed(0)} s ago` : s < 5400 ? `${(s / 60).toFixed(0)} min ago` : when(iso);
}

// Show an error (the API's text as it is) in the page's alert element.
export function showError(error, el = document.getElementById("error")) {
  if (!el) return;
  el.textContent = error ? error.message ?? String(error) : "";
  el.hidden = !error;
}

// A table body from rows; `empty` is shown (and the table hidden) when there are none.
export function fillTable(table, rows, render, empty) {
  const body = table.tBodies[0];
  body.replaceChildren(...rows.map(render));
  table.hidden = rows.length === 0;
  if (empty) empty.hidden = rows.length !== 0;
}

// Ask before a mutation: a native <dialog> with the action's words; resolves true on confirm.
export function confirmAction(question) {
  return new Promise((resolve) => {
    const dialog = h("dialog", { "aria-labelledby": "confirm-q" },
      h("p", { id: "confirm-q" }, question),
      h("form", { method: "dialog", class: "actions" },
        h("button", { value: "no" }, "Cancel"),
        h("button", { value: "yes", class: "primary" }, "Confirm")));
    dialog.addEventListener("close", () => { resolve(dialog.returnValue === "yes"); dialog.remove(); });
    document.body.append(dialog);
    dialog.showModal();
  });
}

export const canOperate = () => ["operator", "admin"].includes(document.getElementById("main").dataset.role);
