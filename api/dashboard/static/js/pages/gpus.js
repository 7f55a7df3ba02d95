// GPUs: every host's GPUs, each with its health (and why it is unhealthy), the models a load
// on it alone ran out of memory for, its memory now, and an hour of utilisation, memory and
// power. Clear marks it healthy again and forgets its too-small marks. Below, the GPUs' events:
// marked unhealthy (and why), cleared, and their workers' crashes.

import { api, has } from "../api.js";
import { gpuHistoryRows } from "../chart.js";
import { $, ago, bar, button, el, fillTable, gpusByUuid, mib, notAvailable, status, when } from "../dom.js";
import { eventRows } from "../events.js";
import { act } from "../refresh.js";

// Samples change only as fast as supervisors write them (every 30 s by default).
const SLOW_MS = 30_000;
let history = { at: 0, data: null };

async function hourOfSamples() {
  if (Date.now() - history.at < SLOW_MS) return history.data;
  history = { at: Date.now(), data: has("/v1/stats/gpus") ? await api("/v1/stats/gpus") : null };
  return history.data;
}

function health(g) {
  if (g.healthy) return el("p", { class: "gpu-health" }, status("healthy"));
  return el("p", { class: "gpu-health error" }, status("unhealthy"), ` ${g.unhealthy_reason || "no reason recorded"}`);
}

function tooSmall(g) {
  if (!g.too_small_for.length) return "";
  return el("p", { class: "too-small small" }, `too small for: ${g.too_small_for.join(", ")}`);
}

function memory(g) {
  const used = g.memory_free_mib === null ? null : g.memory_total_mib - g.memory_free_mib;
  if (used === null) return el("p", { class: "muted" }, `${mib(g.memory_total_mib)}, no live reading`);
  return bar(used / g.memory_total_mib, `${mib(used)} of ${mib(g.memory_total_mib)} used`);
}

function card(g, samples) {
  const clear = () => act(() => api(`/v1/gpus/${encodeURIComponent(g.uuid)}/clear`, { method: "POST" }));
  const marked = !g.healthy || g.too_small_for.length;
  return el(
    "div",
    { class: `card${g.healthy ? "" : " unhealthy"}`, "data-uuid": g.uuid },
    el("h3", {}, `${g.host} / ${g.index}`, el("span", { class: "gpu-name" }, g.name)),
    health(g),
    tooSmall(g),
    memory(g),
    el("p", { class: "small muted", title: when(g.last_seen) }, `${g.uuid} · seen ${ago(g.last_seen)}`),
    samples ? el("div", { class: "history" }, ...gpuHistoryRows(g, samples.series, samples.window)) : "",
    marked ? el("p", {}, button("Clear", clear)) : "",
  );
}

const GPU_EVENTS = "/v1/events?kind=gpu_unhealthy&kind=gpu_cleared&kind=crashed&limit=30";

export async function load() {
  const [gpus, samples, events] = await Promise.all([
    api("/v1/gpus"),
    hourOfSamples(),
    has("/v1/events") ? api(GPU_EVENTS) : null,
  ]);
  const ofGpus = events ? events.data.filter((e) => e.gpu_uuids.length) : [];  // not a CPU worker's crash
  if (events) fillTable($("#gpu-event-list"), eventRows(ofGpus, gpusByUuid(gpus.data)), "no GPU events recorded");
  else notAvailable($("#gpu-event-list"), "/v1/events");
  const series = new Map((samples ? samples.data : []).map((s) => [s.uuid, s.series]));
  const hosts = [...new Set(gpus.data.map((g) => g.host))].sort();
  const sections = hosts.map((host) =>
    el(
      "section",
      { class: "gpu-host", "data-host": host },
      el("h2", {}, host),
      el(
        "div",
        { class: "cards" },
        ...gpus.data
          .filter((g) => g.host === host)
          .map((g) => card(g, samples && { series: series.get(g.uuid) || [], window: samples.window })),
      ),
    ),
  );
  const box = $("#gpu-hosts");
  if (sections.length) box.replaceChildren(...sections);
  else box.replaceChildren(el("p", { class: "muted" }, "No GPUs registered: workers run on the CPU."));
}
