// Models: the registry, where each model is loaded now (which workers, on which GPUs), the
// memory placement counts for it; registering a GGUF file by name and unloading a model from
// every worker that holds it.

import { api, has } from "../api.js";
import { $, button, device, el, fillTable, gpusByUuid, mib, numCell, textCell } from "../dom.js";
import { act } from "../refresh.js";

// The API's request body from the form; an empty VRAM figure leaves gpuq's estimate in use.
function modelBody(form) {
  const value = (name) => form.elements[name].value.trim();
  const body = { name: value("name"), path: value("path"), kinds: value("kinds").split(",") };
  if (value("vram_mib") !== "") body.vram_mib = Number(value("vram_mib"));
  return body;
}

export function setup() {
  const form = $("#model-form");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    act(async () => {
      await api("/v1/models", { method: "POST", body: modelBody(form) });
      form.reset();
    });
  });
}

// What placement counts for the model: the admin's measured figure if set, else the estimate.
function vram(m) {
  const measured = m.vram_override_mib !== null;
  return el(
    "span",
    { title: measured ? `estimated ${mib(m.vram_estimate_mib)}` : "gpuq's estimate" },
    `${mib(m.vram_mib)} `,
    el("span", { class: "small muted vram-basis" }, measured ? "measured" : "estimated"),
  );
}

// The workers holding the model, each as its GPUs' places ("vm / 0") and its name.
function loadedOn(holders, byUuid) {
  if (!holders.length) return el("span", { class: "muted" }, "not loaded");
  const parts = holders.flatMap((w, i) => [i ? ", " : "", device(w.device, byUuid), ` (${w.name})`]);
  return el("span", { class: "list" }, ...parts);
}

export async function load() {
  const [models, workers, gpus] = await Promise.all([
    api("/v1/models"),
    has("/v1/workers") ? api("/v1/workers") : { data: [] },
    api("/v1/gpus"),
  ]);
  const byUuid = gpusByUuid(gpus.data);
  const rows = models.data.map((m) => {
    const holders = workers.data.filter((w) => w.loaded_models.includes(m.id));
    const unload = () => act(() => api(`/v1/models/${encodeURIComponent(m.id)}/unload`, { method: "POST" }));
    return el(
      "tr",
      { "data-model": m.id },
      el("td", {}, m.id),
      el("td", {}, el("span", { class: "list" }, m.kinds.join(", "))),
      numCell(String(m.context_length)),
      numCell(mib(m.size_bytes / 2 ** 20)),
      el("td", { class: "vram" }, vram(m)),
      el("td", { class: "loaded" }, loadedOn(holders, byUuid)),
      textCell(m.path),
      el("td", {}, holders.length ? button("Unload", unload) : ""),
    );
  });
  fillTable($("#models"), rows, "no models registered");
}
