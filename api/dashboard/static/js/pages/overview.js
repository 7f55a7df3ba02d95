// Overview: GPUs (state and running jobs, memory, temperature, power, models loaded), the
// last hour's summary, queue depths, the throughput chart, and the latest failures.

import { api, has, query } from "../api.js";
import { lineChart } from "../chart.js";
import { $, bar, button, el, fillTable, link, notAvailable, number, row, status, when } from "../dom.js";
import { act } from "../refresh.js";

export async function load() {
  const [gpus, workers] = await Promise.all([api("/v1/gpus"), has("/v1/workers") ? api("/v1/workers") : null]);
  drawGpus(gpus.data, workers && workers.data);
  await Promise.all([drawSummary(), drawQueues(), drawThroughput(), drawFailures()]);
}

// The workers pinned to each GPU, by UUID (a worker of a GPU group is pinned to each of them).
function workersByGpu(workers) {
  const pinned = new Map();
  for (const w of workers || []) {
    for (const uuid of w.gpu_uuids) pinned.set(uuid, [...(pinned.get(uuid) || []), w]);
  }
  return pinned;
}

// A job id is long ("job_" + its submission time + 16 random hex digits); its random tail
// tells the few jobs on one GPU apart. The full id is the link's title.
function shortJobLink(id) {
  const a = link(`/dashboard/jobs/${encodeURIComponent(id)}`, `…${id.slice(-6)}`);
  a.title = id;
  return a;
}

// What the GPU does now, from its health and the workers pinned to it: unhealthy, idle,
// busy (K of N of their slots), draining (its workers finish their jobs and take no more)
// or drained. Slots are summed over the workers, as a GPU may have several.
function gpuState(gpu, pinned) {
  if (!gpu.healthy) return { state: "unhealthy", detail: "" };
  if (!pinned.length) return { state: "idle", detail: "no worker" };
  const slots = pinned.reduce((n, w) => n + w.slots, 0);
  const busy = pinned.reduce((n, w) => n + w.slots_busy, 0);
  const ofSlots = `${busy} of ${slots} slot${slots === 1 ? "" : "s"}`;
  if (pinned.every((w) => w.state === "draining" || w.state === "drained")) {
    return busy > 0 ? { state: "draining", detail: `${ofSlots} still busy` } : { state: "drained", detail: "" };
  }
  if (busy > 0) return { state: "busy", detail: `with ${ofSlots}` };
  return { state: "idle", detail: `${slots} slot${slots === 1 ? "" : "s"} free` };
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

// One card per GPU; `workers` is null where this server has no /v1/workers.
function drawGpus(gpus, workers) {
  const pinned = workersByGpu(workers);
  const cards = gpus.map((g) => {
    const mine = workers === null ? null : pinned.get(g.uuid) || [];
    const used = g.memory_free_mib === null ? null : g.memory_total_mib - g.memory_free_mib;
    const memory =
      used === null
        ? el("p", { class: "muted" }, `${g.memory_total_mib} MiB, no live reading`)
        : bar(used / g.memory_total_mib, `${used} / ${g.memory_total_mib} MiB`);
    const models = [...new Set((mine || []).flatMap((w) => w.loaded_models))];
    const loaded = mine === null ? "" : `models: ${models.join(", ") || "none loaded"}`;
    return el(
      "div",
      { class: `card${g.healthy ? "" : " unhealthy"}`, "data-uuid": g.uuid },
      el("h3", {}, `${g.host} / ${g.index}: ${g.name}`),
      gpuActivity(g, mine),
      memory,
      el(
        "p",
        {},
        `${g.temperature_c ?? "–"} °C · ${g.power_w === null ? "–" : number(g.power_w, 0)} W · `,
        `${g.utilisation_pct ?? "–"} % busy · ${g.live ? "live" : "no telemetry"}`,
      ),
      el("p", { class: "small models" }, loaded),
      g.healthy
        ? ""
        : el(
            "p",
            { class: "error" },
            `unhealthy: ${g.unhealthy_reason || ""} `,
            button("Clear", () =>
              act(() => api(`/v1/gpus/${encodeURIComponent(g.uuid)}/clear`, { method: "POST" })),
            ),
          ),
    );
  });
  const box = $("#gpus");
  if (cards.length) box.replaceChildren(...cards);
  else box.replaceChildren(el("p", { class: "muted" }, "No GPUs registered: workers run on the CPU."));
}

async function drawSummary() {
  const box = $("#summary");
  if (!has("/v1/stats/summary")) return notAvailable(box, "/v1/stats/summary");
  const s = await api("/v1/stats/summary");
  const f = s.finished;
  const parts = [
    `Now: ${s.in_flight.queued ?? 0} queued, ${s.in_flight.running ?? 0} running.`,
    `Last hour: ${f.succeeded ?? 0} succeeded, ${f.failed ?? 0} failed, ${f.cancelled ?? 0} cancelled;`,
    `queue wait p50 ${number(s.queue_wait.p50_ms)} ms, p95 ${number(s.queue_wait.p95_ms)} ms;`,
    `run p50 ${number(s.run_time.p50_ms)} ms;`,
    s.usage.tokens_per_s === null ? "" : `${number(s.usage.tokens_per_s, 1)} tokens/s;`,
    s.usage.energy_jobs ? `${number(s.usage.energy_j / 3600, 2)} Wh.` : "",
  ];
  box.textContent = parts.filter(Boolean).join(" ");
}

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
      ...[
        priority,
        String(mine.reduce((sum, q) => sum + q.depth, 0)),
        mine.length ? `${number(waited, 1)} s` : "",
        mine.map((q) => `${q.model} ${q.kind}: ${q.depth}`).join(", "),
      ].map((c) => el("td", {}, c)),
    );
  });
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

// The last failed jobs, and the most common failure reasons where the stats endpoint exists.
async function drawFailures() {
  const [failed, reasons] = await Promise.all([
    api(`/v1/jobs${query({ status: "failed", limit: 10 })}`),
    has("/v1/stats/failures") ? api("/v1/stats/failures?top=10") : null,
  ]);
  const jobLink = (id) => link(`/dashboard/jobs/${encodeURIComponent(id)}`, id);
  fillTable(
    $("#failures"),
    failed.data.map((j) => row(when(j.finished_at), jobLink(j.id), j.model, j.error || "")),
    "no failed jobs",
  );
  if (reasons === null) return notAvailable($("#failure-reasons"), "/v1/stats/failures");
  fillTable(
    $("#failure-reasons"),
    reasons.data.map((r) => row(String(r.jobs), r.reason, jobLink(r.latest_job_id))),
    "no failures in the last hour",
  );
}
