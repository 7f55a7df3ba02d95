// One job (/dashboard/jobs/{id}): its fields, timings, prompt, result and webhook
// deliveries; cancel, retry and requeue where this server has them.

import { api, has } from "../api.js";
import { $, device, duration, el, energy, fillTable, gpusByUuid, link, number, row, status, textCell, when } from "../dom.js";
import { act } from "../refresh.js";

const FINAL_JOB_STATUSES = new Set(["succeeded", "failed", "cancelled"]);

// The id comes from the address, read here; the server never writes it into the HTML.
function jobId() {
  return decodeURIComponent(location.pathname.split("/").pop());
}

export function setup() {
  const actions = { cancel: "/cancel", retry: "/retry", requeue: "/requeue" };
  for (const [name, suffix] of Object.entries(actions)) {
    const control = $(`#job-actions [data-action="${name}"]`);
    const path = `/v1/jobs/{job_id}${suffix}`;
    control.hidden = !has(path);
    control.addEventListener("click", () =>
      act(() => api(`/v1/jobs/${encodeURIComponent(jobId())}${suffix}`, { method: "POST" })),
    );
  }
}

// A <dl> of name/value pairs; a value may be a node (a link, a status).
function fields(list, pairs) {
  list.replaceChildren(...pairs.flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, value ?? "")]));
}

function promptText(request) {
  if (request.prompt !== undefined) return request.prompt;
  if (request.prompt_token_ids) return `token ids: ${JSON.stringify(request.prompt_token_ids)}`;
  if (request.messages) return request.messages.map((m) => `${m.role}: ${m.content}`).join("\n\n");
  if (request.input) return request.input.join("\n---\n");
  return JSON.stringify(request, null, 2);
}

// When it is needed by; a job still queued after it says so, as /metrics counts it
// (gpuq_queued_jobs_past_deadline). Null when it gave none: the row is then left out.
function deadlineText(j) {
  if (!j.deadline) return null;
  const late = j.status === "queued" && new Date(j.deadline).getTime() <= Date.now();
  if (!late) return when(j.deadline);
  return el("span", {}, when(j.deadline), " ", el("span", { class: "status late" }, "queued past its deadline"));
}

// Energy and GPU time are measured through NVML on real GPUs only; a job that ran on the CPU
// or a simulated GPU has none, which is said rather than left blank.
function unmeasured(j) {
  return j.device && FINAL_JOB_STATUSES.has(j.status) ? "not measured (CPU or simulated GPU)" : "";
}

// Energy and GPU seconds are the job's part of its GPU's when other jobs were decoded beside
// it (energy_share < 1): said so, or a reader would take them for the GPU's whole figure.
function energyText(j) {
  if (j.energy_j === null) return unmeasured(j);
  const joules = energy(j.energy_j);
  if (j.energy_share === null || j.energy_share === undefined || j.energy_share >= 1) return joules;
  const pct = number(j.energy_share * 100, j.energy_share < 0.1 ? 1 : 0);
  return `${joules} (shared GPU: ${pct} % of its energy and GPU time while this job ran, by token share)`;
}

function resultText(result) {
  if (!result) return "";
  if (result.text !== undefined) return result.text;
  // Embeddings: a few numbers of each vector are enough to see them.
  if (result.embeddings) {
    return result.embeddings
      .map((v, i) => `[${i}] ${v.slice(0, 8).map((x) => x.toFixed(4)).join(", ")}, … (${result.dimensions} dimensions)`)
      .join("\n");
  }
  return JSON.stringify(result, null, 2);
}

export async function load() {
  const id = encodeURIComponent(jobId());
  const [j, deliveries, gpus] = await Promise.all([
    api(`/v1/jobs/${id}`),
    api(`/v1/webhooks/deliveries?job_id=${id}`),
    api("/v1/gpus"),
  ]);
  document.title = `gpuq · ${j.id}`;
  fields($("#job-fields"), [
    ["id", j.id],
    ["status", status(j.status)],
    ["kind", j.kind],
    ["model", j.model],
    ["priority", j.priority],
    ["owner", j.owner],
    ["batch", j.batch_id ? link(`/dashboard/jobs?batch_id=${encodeURIComponent(j.batch_id)}`, j.batch_id) : ""],
    ["worker", j.worker],
    ["device", device(j.device, gpusByUuid(gpus.data))],
    ["host", j.host],
    ["attempts", String(j.attempts)],
    ["error", j.error],
  ]);
  const deadline = deadlineText(j);
  fields($("#job-timings"), [
    ["created", when(j.created_at)],
    ...(deadline === null ? [] : [["deadline", deadline]]),
    ["started", when(j.started_at)],
    ["finished", when(j.finished_at)],
    ["queue wait", duration(j.queue_wait_ms)],
    ["model load", duration(j.load_ms)],
    ["run", duration(j.run_ms)],
    ["tokens", j.prompt_tokens === null ? "" : `${j.prompt_tokens} prompt + ${j.completion_tokens ?? 0} completion`],
    ["GPU time", j.gpu_seconds === null ? unmeasured(j) : duration(j.gpu_seconds * 1000)],
    ["energy", energyText(j)],
  ]);
  $("#job-prompt").textContent = promptText(j.request);
  $("#job-result").textContent = resultText(j.result);
  // Cancel and requeue act on unfinished jobs; retry on failed or cancelled ones.
  const final = FINAL_JOB_STATUSES.has(j.status);
  $('#job-actions [data-action="cancel"]').disabled = final;
  $('#job-actions [data-action="requeue"]').disabled = final;
  $('#job-actions [data-action="retry"]').disabled = !final || j.status === "succeeded";
  fillTable(
    $("#job-webhooks"),
    deliveries.data.map((d) =>
      row(
        d.event,
        textCell(d.url),
        status(d.status),
        String(d.attempts),
        textCell(d.last_error || String(d.last_status_code ?? "")),
        when(d.delivered_at),
      ),
    ),
    j.request.webhook_url ? "none yet" : "no webhook_url on this job",
  );
}
