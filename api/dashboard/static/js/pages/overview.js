// Overview: the last hour in figures; one card per GPU (its state, running jobs, memory,
// live readings, models loaded, and an hour of utilisation, memory and power); queue
// depths, the throughput chart, energy by model, and the latest failures.

import { api, has, query } from "../api.js";
import { gpuHistoryRows, lineChart } from "../chart.js";
import {
  $,
  bar,
  button,
  duration,
  el,
  energy,
  fillTable,
  jobLink,
  mib,
  notAvailable,
  number,
  numCell,
  row,
  shortJobLink,
  status,
  textCell,
  when,
} from "../dom.js";
import { act } from "../refresh.js";

// GPU history and energy change only as fast as supervisors write samples (every 30 s by
// default) and jobs finish, so they are read at most this often, not on every 5 s poll.
const SLOW_MS = 30_000;
let slow = { at: 0, history: null, energy: null };

async function slowData() {
  if (Date.now() - slow.at < SLOW_MS) return slow;
  const [history, energyStats] = await Promise.all([
    has("/v1/stats/gpus") ? api("/v1/stats/gpus") : null,
    has("/v1/stats/energy") ? api("/v1/stats/energy") : null,
  ]);
  slow = { at: Date.now(), history, energy: energyStats };
  return slow;
}

export async function load() {
  const [gpus, workers, { history, energy: energyStats }] = await Promise.all([
    api("/v1/gpus"),
    has("/v1/workers") ? api("/v1/workers") : null,
    slowData(),
  ]);
  drawGpus(gpus.data, workers && workers.data, history);
  drawEnergy(energyStats);
  await Promise.all([drawSummary(), drawQueues(), drawTenants(), drawThroughput(), drawFailures()]);
}

// ---------------------------------------------------------------- the figures at the top

// A figure at the top; `bad` colours its value (a failed count above 0, never a 0).
function tile(label, value, detail = "", { bad = false } = {}) {
  return el(
    "div",
    { class: `tile${bad ? " tile-bad" : ""}`, "data-tile": label },
    el("div", { class: "tile-label" }, label),
    el("div", { class: "tile-value" }, value),
    el("div", { class: "tile-detail" }, detail),
  );
}

const percentiles = (p) => (p.jobs ? `p50 ${duration(p.p50_ms)} · p95 ${duration(p.p95_ms)}` : "no jobs yet");

async function drawSummary() {
  const box = $("#summary");
  if (!has("/v1/stats/summary")) return notAvailable(box, "/v1/stats/summary");
  const s = await api("/v1/stats/summary");
  const f = s.finished;
  const u = s.usage;
  box.replaceChildren(
    tile("queued", String(s.in_flight.queued ?? 0), "waiting now"),
    tile("running", String(s.in_flight.running ?? 0), "now"),
    tile("succeeded", String(f.succeeded ?? 0), "last hour"),
    tile("failed", String(f.failed ?? 0), `${f.cancelled ?? 0} cancelled, last hour`, { bad: (f.failed ?? 0) > 0 }),
    tile("queue wait", duration(s.queue_wait.p50_ms) || "–", percentiles(s.queue_wait)),
    tile("run time", duration(s.run_time.p50_ms) || "–", percentiles(s.run_time)),
    // Two speeds, apart: what the fleet produced per second of the hour, and how fast each
    // sequence decoded while it ran (which falls as more sequences share a GPU).
    tile(
      "throughput",
      u.fleet_tokens_per_s === null ? "–" : `${number(u.fleet_tokens_per_s, 1)} tok/s`,
      `completion tokens per second of the hour: ${u.completion_tokens} completion, ${u.prompt_tokens} prompt`,
    ),
    tile(
      "decode speed",
      u.tokens_per_s === null ? "–" : `${number(u.tokens_per_s, 1)} tok/s`,
      "per sequence, while decoding",
    ),
    tile(
      "energy",
      u.energy_jobs ? energy(u.energy_j) : "–",
      u.energy_jobs ? `${u.energy_jobs} of ${u.jobs} jobs measured` : "not measured (CPU or simulated GPUs)",
    ),
  );
}

// ---------------------------------------------------------------- GPUs

// The workers pinned to each GPU, by UUID (a worker of a GPU group is pinned to each of them).
function workersByGpu(workers) {
  const pinned = new Map();
  for (const w of workers || []) {
    for (const uuid of w.gpu_uuids) pinned.set(uuid, [...(pinned.get(uuid) || []), w]);
  }
  return pinned;
}

const slotsText = (n) => `${n} slot${n === 1 ? "" : "s"}`;

// What the GPU does now, from its health and the workers pinned to it: unhealthy, idle,
// busy (K of N of their slots), draining (its workers finish their jobs and take no more)
// or drained. Slots are summed over the workers, as a GPU may have several.
function gpuState(gpu, pinned) {
  if (!gpu.healthy) return { state: "unhealthy", detail: "" };
  if (!pinned.length) return { state: "idle", detail: "no worker" };
  const slots = pinned.reduce((n, w) => n + w.slots, 0);
  const busy = pinned.reduce((n, w) => n + w.slots_busy, 0);
  const ofSlots = `${busy} of ${slotsText(slots)}`;
  if (pinned.every((w) => w.state === "draining" || w.state === "drained")) {
    return busy > 0 ? { state: "draining", detail: `${ofSlots} still busy` } : { state: "drained", detail: "" };
  }
  if (busy > 0) return { state: "busy", detail: `with ${ofSlots}` };
  return { state: "idle", detail: `${slotsText(slots)} free` };
}

// The state line of a GPU card, with the jobs running on it; `pinned` is null where this
// server has no /v1/workers, and then only an unhealthy GPU says so.
function gpuActivity(gpu, pinned) {
  if (pinned === null) return gpu.healthy ? "" : el("p", { class: "gpu-state" }, status("unhealthy"));
  const { state, detail } = gpuState(gpu, pinned);
  const jobs = [...new Set(pinned.flatMap((w) => w.running_jobs))].sort();
  const links = jobs.flatMap((id, i) => (i ? [", ", shortJobLink(id)] : [shortJobLink(id)]));
  return el(
    "p",
    { class: "gpu-state", "data-state": state },
    status(state),
    detail ? ` ${detail}` : "",
    jobs.length ? el("span", { class: "small running" }, " · running ", ...links) : "",
  );
}

// Utilisation, temperature and power as read now; a simulated GPU has only memory.
function readings(g) {
  if (!g.live) return el("p", { class: "readings muted" }, "no telemetry: its supervisor has not reported lately");
  const parts = [
    g.utilisation_pct === null ? null : `${g.utilisation_pct} % busy`,
    g.temperature_c === null ? null : `${g.temperature_c} °C`,
    g.power_w === null ? null : `${number(g.power_w, 0)} W`,
  ].filter(Boolean);
  if (!parts.length) {
    return el("p", { class: "readings muted" }, g.simulated ? "simulated: memory only" : "no utilisation reading");
  }
  return el("p", { class: "readings" }, parts.join(" · "));
}

function memory(g) {
  const used = g.memory_free_mib === null ? null : g.memory_total_mib - g.memory_free_mib;
  if (used === null) return el("p", { class: "muted" }, `${mib(g.memory_total_mib)}, no live reading`);
  return bar(used / g.memory_total_mib, `${mib(used)} of ${mib(g.memory_total_mib)} used`);
}

function clearButton(g) {
  const clear = () => act(() => api(`/v1/gpus/${encodeURIComponent(g.uuid)}/clear`, { method: "POST" }));
  return el("p", { class: "error" }, `unhealthy: ${g.unhealthy_reason || ""} `, button("Clear", clear));
}

// One card per GPU; `workers` is null where this server has no /v1/workers, `history` where
// it has no /v1/stats/gpus.
function drawGpus(gpus, workers, history) {
  const pinned = workersByGpu(workers);
  const series = new Map((history ? history.data : []).map((h) => [h.uuid, h.series]));
  const cards = gpus.map((g) => {
    const mine = workers === null ? null : pinned.get(g.uuid) || [];
    const models = [...new Set((mine || []).flatMap((w) => w.loaded_models))];
    return el(
      "div",
      { class: `card${g.healthy ? "" : " unhealthy"}`, "data-uuid": g.uuid },
      el("h3", {}, `${g.host} / ${g.index}`, el("span", { class: "gpu-name" }, g.name)),
      gpuActivity(g, mine),
      memory(g),
      readings(g),
      mine === null ? "" : el("p", { class: "small models" }, `models: ${models.join(", ") || "none loaded"}`),
      history ? el("div", { class: "history" }, ...gpuHistoryRows(g, series.get(g.uuid) || [], history.window)) : "",
      g.healthy ? "" : clearButton(g),
    );
  });
  const box = $("#gpus");
  if (cards.length) box.replaceChildren(...cards);
  else box.replaceChildren(el("p", { class: "muted" }, "No GPUs registered: workers run on the CPU."));
}

// ---------------------------------------------------------------- queues, throughput, energy, failures

// One row per priority, summed over models and kinds, with the longest wait at a queue's front.
async function drawQueues() {
  const table = $("#queues");
  if (!has("/v1/stats/queues")) return notAvailable(table, "/v1/stats/queues");
  const queues = (await api("/v1/stats/queues")).data;
  const rows = ["high", "normal", "low"].map((priority) => {
    const mine = queues.filter((q) => q.priority === priority && q.depth > 0);
    const waited = Math.max(0, ...mine.map((q) => q.front_waiting_s || 0));
    return el(
      "tr",
      { "data-priority": priority },
      el("td", {}, priority),
      numCell(String(mine.reduce((sum, q) => sum + q.depth, 0))),
      numCell(mine.length ? duration(waited * 1000) : ""),
      textCell(mine.map((q) => `${q.model} ${q.kind}: ${q.depth}`).join(", ")),
    );
  });
  fillTable(table, rows);
}

// Each tenant's share of the fleet (fair shares between tenants of one priority): of the jobs
// running now, and of the run time of the jobs that finished in the last hour.
async function drawTenants() {
  const table = $("#tenants");
  if (!has("/v1/stats/tenants")) return notAvailable(table, "/v1/stats/tenants");
  const tenants = (await api("/v1/stats/tenants")).data;
  const percent = (share) => `${Math.round(share * 100)}%`;
  const rows = tenants.map((t) =>
    el(
      "tr",
      { "data-tenant": t.tenant },
      textCell(t.tenant || "(no tenant)"),
      numCell(String(t.queued)),
      numCell(String(t.running)),
      el("td", {}, bar(t.share_now, `${percent(t.share_now)} (${t.running} running)`)),
      el("td", {}, bar(t.share_window, `${percent(t.share_window)} (${t.finished} jobs, ${duration(t.run_s * 1000)})`)),
    ),
  );
  fillTable(table, rows);
}

// Jobs finished and failed per minute; failures come per bucket, so they are scaled to match.
async function drawThroughput() {
  const box = $("#throughput");
  if (!has("/v1/stats/throughput")) return notAvailable(box, "/v1/stats/throughput");
  const series = await api("/v1/stats/throughput");
  const perMinute = 60 / series.bucket_s;
  const at = (p) => new Date(p.start).getTime();
  box.replaceChildren(
    lineChart([
      { name: "finished", css: "finished", points: series.data.map((p) => ({ t: at(p), v: p.jobs_per_min })) },
      { name: "failed", css: "failed", points: series.data.map((p) => ({ t: at(p), v: p.failed * perMinute })) },
    ]),
  );
}

// Energy and GPU time per model, measured on real GPUs only: a CPU or simulated GPU job has
// no figure, which is said rather than shown as zero.
function drawEnergy(stats) {
  const table = $("#energy");
  if (stats === null) return notAvailable(table, "/v1/stats/energy");
  const measured = (value, jobs, format) => (jobs ? format(value) : "not measured");
  const rows = stats.by_model.map((m) =>
    el(
      "tr",
      { "data-model": m.key },
      el("td", {}, m.key),
      numCell(String(m.jobs)),
      numCell(`${m.prompt_tokens} + ${m.completion_tokens}`),
      numCell(measured(m.gpu_seconds, m.gpu_seconds_jobs, (s) => duration(s * 1000))),
      numCell(measured(m.energy_j, m.energy_jobs, energy)),
    ),
  );
  fillTable(table, rows, "no jobs finished in the last hour");
  const t = stats.total;
  $("#energy-note").textContent =
    t.jobs && t.energy_jobs < t.jobs
      ? `Energy measured for ${t.energy_jobs} of ${t.jobs} jobs: jobs on the CPU or a simulated GPU have no figure.`
      : "";
}

// The last failed jobs, and the most common failure reasons where the stats endpoint exists.
async function drawFailures() {
  const [failed, reasons] = await Promise.all([
    api(`/v1/jobs${query({ status: "failed", limit: 10 })}`),
    has("/v1/stats/failures") ? api("/v1/stats/failures?top=10") : null,
  ]);
  fillTable(
    $("#failures"),
    failed.data.map((j) => row(when(j.finished_at), jobLink(j.id), j.model, textCell(j.error || ""))),
    "no failed jobs",
  );
  if (reasons === null) return notAvailable($("#failure-reasons"), "/v1/stats/failures");
  fillTable(
    $("#failure-reasons"),
    reasons.data.map((r) => row(numCell(String(r.jobs)), textCell(r.reason), shortJobLink(r.latest_job_id))),
    "no failures in the last hour",
  );
}
