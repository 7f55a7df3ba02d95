// Worker and GPU events (GET /v1/events) as table rows, for the workers and GPUs pages:
// when, what, where (host / slot, or the GPU's place), which worker, and in words how.

import { ago, el, textCell, when } from "./dom.js";

const KIND_LABELS = { gpu_unhealthy: "GPU unhealthy", gpu_cleared: "GPU cleared" };

// host / slot for a worker's event, the GPU's place for a GPU's, the host for a host's drain.
function where(e, gpus) {
  if (e.slot) return `${e.host} / ${e.slot}`;
  const places = e.gpu_uuids.map((uuid) => {
    const gpu = gpus.get(uuid);
    return gpu ? `${gpu.host} / ${gpu.index}` : uuid;
  });
  return places.join(" + ") || `${e.host || ""} (whole host)`;
}

// One row per event; its kind a badge coloured by app.css (a crash or an unhealthy mark in red).
export function eventRows(events, gpus) {
  return events.map((e) =>
    el(
      "tr",
      { "data-event": String(e.id), "data-kind": e.kind },
      el("td", { title: when(e.at) }, ago(e.at)),
      el("td", {}, el("span", { class: `status event-${e.kind}` }, KIND_LABELS[e.kind] || e.kind)),
      el("td", {}, where(e, gpus)),
      el("td", { class: "id" }, e.worker || ""),
      textCell(e.detail),
    ),
  );
}
