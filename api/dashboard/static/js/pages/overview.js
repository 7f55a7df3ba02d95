// Overview: GPUs (memory, temperature, power, models loaded), the last hour's summary,
// queue depths, the throughput chart, and the latest failures.

import { api, has, query } from "../api.js";
import { lineChart } from "../chart.js";
import { $, bar, button, el, fillTable, link, notAvailable, number, row, when } from "../dom.js";
import { act } from "../refresh.js";

export async function load() {
  const [gpus, workers] = await Promise.all([api("/v1/gpus"), has("/v1/workers") ? api("/v1/workers") : null]);
  drawGpus(gpus.data, workers && workers.data);
  await Promise.all([drawSummary(), drawQueues(), drawThroughput(), drawFailures()]);
}

// Models loaded on each GPU, by UUID, from the workers pinned to it.
function modelsByGpu(workers) {
  const models = new Map();
  for (const w of workers || []) {
    for (const uuid of w.gpu_uuids) models.set(uuid, [...(models.get(uuid) || []), ...w.loaded_models]);
  }
  return models;
}

// One card per GPU; `workers` is null where this server has no /v1/workers.
function drawGpus(gpus, workers) {
  const models = modelsByGpu(workers);
  const cards = gpus.map((g) => {
    const used = g.memory_free_mib === null ? null : g.memory_total_mib - g.memory_free_mib;
    const memory =
      used === null
        ? el("p", { class: "muted" }, `${g.memory_total_mib} MiB, no live reading`)
        : bar(used / g.memory_total_mib, `${used} / ${g.memory_total_mib} MiB`);
    const loaded = workers === null ? "" : `models: ${[...new Set(models.get(g.uuid) || [])].join(", ") || "none loaded"}`;
    return el(
      "div",
      { class: `card${g.healthy ? "" : " unhealthy"}`, "data-uuid": g.uuid },
      el("h3", {}, `${g.host} / ${g.index}: ${g.name}`),
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
