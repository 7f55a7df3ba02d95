// Affinity rules: the list, a form that creates or edits one, and the placement preview
// (which GPUs a model and kind may run on under the rules as they are now).

import { api, query } from "../api.js";
import { $, button, el, fillTable, mib, row, showMessage, textCell } from "../dom.js";
import { act } from "../refresh.js";

// The form's fields, by how they are sent: comma-separated lists, numbers, and text.
const RULE_LISTS = ["gpu_indices", "gpu_uuids"];
const RULE_NUMBERS = ["precedence", "min_memory_mib"];
const RULE_TEXTS = ["model_pattern", "kind", "effect", "gpu_name_pattern", "host_pattern"];

// The GPUs a rule names, in one line for the table.
function ruleGpus(r) {
  const parts = [];
  if (r.gpu_indices) parts.push(`indices ${r.gpu_indices.join(",")}`);
  if (r.gpu_uuids) parts.push(`UUIDs ${r.gpu_uuids.join(",")}`);
  if (r.gpu_name_pattern) parts.push(`name ${r.gpu_name_pattern}`);
  if (r.host_pattern) parts.push(`host ${r.host_pattern}`);
  if (r.min_memory_mib) parts.push(`≥ ${mib(r.min_memory_mib)}`);
  return parts.join("; ") || "all GPUs";
}

// "0,1", "0-3" or "0-1,4" as GPU indices (as `gpuq rules add --gpus` reads them); anything
// else is refused here with what to type, before the API is asked.
function gpuIndices(items) {
  return items.flatMap((item) => {
    const range = /^(\d+)(?:-(\d+))?$/.exec(item);
    if (!range) throw new Error(`GPU indices: "${item}" is not an index or a range (e.g. 0,1 or 0-3)`);
    const [low, high] = [Number(range[1]), Number(range[2] ?? range[1])];
    if (high < low) throw new Error(`GPU indices: "${item}" goes down; write ${high}-${low}`);
    return Array.from({ length: high - low + 1 }, (_, i) => low + i);
  });
}

// The API's request body from the form; an empty field is null (no condition).
function ruleBody(form) {
  const value = (name) => form.elements[name].value.trim();
  const body = {};
  for (const name of RULE_TEXTS) body[name] = value(name) || null;
  for (const name of RULE_NUMBERS) body[name] = value(name) === "" ? null : Number(value(name));
  body.precedence = body.precedence ?? 0;
  for (const name of RULE_LISTS) {
    const items = value(name).split(",").map((s) => s.trim()).filter(Boolean);
    body[name] = items.length ? (name === "gpu_indices" ? [...new Set(gpuIndices(items))].sort((a, b) => a - b) : items) : null;
  }
  return body;
}

// Fills the form with rule `r` to edit it, or empties it for a new one (r null).
function editRule(r) {
  const form = $("#rule-form");
  form.reset();
  form.elements.id.value = r ? r.id : "";
  if (r) {
    for (const name of [...RULE_TEXTS, ...RULE_NUMBERS]) form.elements[name].value = r[name] ?? "";
    for (const name of RULE_LISTS) form.elements[name].value = (r[name] || []).join(",");
  }
  $("#rule-form-title").textContent = r ? `Edit rule ${r.id}` : "New rule";
  $("#rule-save").textContent = r ? "Save rule" : "Create rule";
  $("#rule-warnings").replaceChildren();
}

export function setup() {
  const form = $("#rule-form");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const id = form.elements.id.value;
    act(async () => {
      const saved = await api(id ? `/v1/affinity-rules/${id}` : "/v1/affinity-rules", {
        method: id ? "PUT" : "POST",
        body: ruleBody(form),
      });
      editRule(null);
      $("#rule-warnings").replaceChildren(...saved.warnings.map((w) => el("li", {}, `rule ${saved.rule.id}: ${w}`)));
    });
  });
  $("#rule-new").addEventListener("click", () => editRule(null));
  $("#preview-form").addEventListener("submit", (event) => {
    event.preventDefault();
    act(drawPreview, async () => {}); // the preview is not polled: no refresh after it
  });
  // The preview's model list is read once, not on every refresh.
  api("/v1/models")
    .then((models) => {
      $("#preview-model").replaceChildren(...models.data.map((m) => el("option", {}, m.id)));
    })
    .catch((error) => showMessage(error.message));
}

// A reason, or the long explanation in parentheses at its end (how the VRAM figure was
// estimated), given for several GPUs is written once under the table and referred to by its
// number in their rows, instead of repeated on each.
const EXPLAINED = /^(.*) \(([^()]{40,})\)$/s;

function notesOf(gpus) {
  const counts = new Map();
  const count = (text) => counts.set(text, (counts.get(text) || 0) + 1);
  for (const g of gpus) {
    for (const reason of new Set(g.reasons)) {
      const explained = reason.match(EXPLAINED);
      count(reason);
      if (explained) count(explained[2]);
    }
  }
  return [...counts].filter(([, n]) => n > 1).map(([text]) => text);
}

function why(reasons, notes) {
  const see = (text) => `see (${notes.indexOf(text) + 1})`;
  return reasons
    .map((reason) => {
      if (notes.includes(reason)) return see(reason);
      const explained = reason.match(EXPLAINED);
      return explained && notes.includes(explained[2]) ? `${explained[1]} (${see(explained[2])})` : reason;
    })
    .join("; ");
}

async function drawPreview() {
  const form = $("#preview-form");
  const result = await api(`/v1/affinity-rules/preview${query({ model: form.elements.model.value, kind: form.elements.kind.value })}`);
  $("#preview-summary").textContent = result.summary;
  const notes = notesOf(result.gpus);
  fillTable(
    $("#preview"),
    result.gpus.map((g) =>
      row(
        `${g.host} / ${g.index}: ${g.name}`,
        g.may_run ? "yes" : "no",
        g.allowed ? "yes" : "no",
        g.fits ? "yes" : "no",
        textCell(why(g.reasons, notes)),
      ),
    ),
    "no GPUs registered",
  );
  $("#preview-notes").replaceChildren(...notes.map((text, i) => el("li", { value: String(i + 1) }, text)));
}

export async function load() {
  const rules = await api("/v1/affinity-rules");
  const rows = rules.data.map((r) =>
    el(
      "tr",
      { "data-rule": r.id },
      ...[
        String(r.id),
        r.model_pattern,
        r.kind || "any",
        r.effect,
        String(r.precedence),
        el("span", { class: "list" }, ruleGpus(r)),
        el(
          "span",
          { class: "actions" },
          button("Edit", () => editRule(r)),
          button("Delete", () => act(() => api(`/v1/affinity-rules/${r.id}`, { method: "DELETE" }))),
        ),
      ].map((c) => el("td", {}, c)),
    ),
  );
  fillTable($("#rules"), rows, "no rules: every model may run on every GPU it fits");
}
