// Keys and tenants: every active key with its role, owner, limits, last use and what it
// submitted in the past hour, the same summed by tenant; creating a key (its secret is shown
// once, here) and revoking one.

import { api, storedKey } from "../api.js";
import { $, ago, button, el, fillTable, numCell, when } from "../dom.js";
import { act } from "../refresh.js";

const NUMBERS = ["max_queued_jobs", "max_submissions_per_minute"];

// The API's request body from the form; an empty field is no limit.
function keyBody(form) {
  const value = (name) => form.elements[name].value.trim();
  const body = { name: value("name"), owner: value("owner"), role: value("role") };
  for (const name of NUMBERS) if (value(name) !== "") body[name] = Number(value(name));
  if (value("default_priority") !== "") body.default_priority = value("default_priority");
  return body;
}

export function setup() {
  const form = $("#key-form");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    act(async () => {
      const created = await api("/v1/keys", { method: "POST", body: keyBody(form) });
      form.reset();
      $("#key-secret-value").textContent = created.key;
      $("#key-secret").hidden = false;
    });
  });
}

function limits(k) {
  const parts = [
    k.max_queued_jobs === null ? null : `${k.max_queued_jobs} queued`,
    k.max_submissions_per_minute === null ? null : `${k.max_submissions_per_minute}/min`,
    k.default_priority === null ? null : `priority ${k.default_priority}`,
  ].filter(Boolean);
  return el("span", { class: "list" }, parts.join(", ") || "no limits");
}

const usage = (jobs, tokens) => `${jobs} job${jobs === 1 ? "" : "s"} · ${tokens} token${tokens === 1 ? "" : "s"}`;

export async function load() {
  const keys = (await api("/v1/keys")).data;
  // The signed-in key, told by its prefix (the secret itself is never sent back).
  const mine = (storedKey() || "").slice(0, keys.length ? keys[0].prefix.length : 0);
  const rows = keys.map((k) => {
    const revoke = () => act(() => api(`/v1/keys/${encodeURIComponent(k.id)}`, { method: "DELETE" }));
    return el(
      "tr",
      { "data-key": k.id },
      el(
        "td",
        {},
        k.name,
        k.prefix === mine ? el("span", { class: "muted small" }, " (this tab's key)") : "",
        el("div", { class: "id small muted" }, `${k.id} · ${k.prefix}…`),
      ),
      el("td", {}, k.owner),
      el("td", {}, k.role),
      el("td", {}, limits(k)),
      el("td", { title: when(k.last_used_at) }, k.last_used_at ? ago(k.last_used_at) : "never"),
      el("td", { class: "usage" }, usage(k.jobs_last_hour, k.tokens_last_hour)),
      el("td", {}, button("Revoke", revoke)),
    );
  });
  fillTable($("#keys"), rows, "no keys");

  const tenants = new Map();
  for (const k of keys) {
    const t = tenants.get(k.owner) || { keys: 0, jobs: 0, tokens: 0 };
    tenants.set(k.owner, { keys: t.keys + 1, jobs: t.jobs + k.jobs_last_hour, tokens: t.tokens + k.tokens_last_hour });
  }
  const tenantRows = [...tenants.keys()].sort().map((owner) => {
    const t = tenants.get(owner);
    return el(
      "tr",
      { "data-tenant": owner },
      el("td", {}, owner),
      numCell(String(t.keys)),
      numCell(String(t.jobs)),
      numCell(String(t.tokens)),
    );
  });
  fillTable($("#tenants"), tenantRows, "no tenants");
}
