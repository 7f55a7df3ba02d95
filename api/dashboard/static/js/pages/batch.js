// One batch (/dashboard/batches/{id}): its lines counted by status, throughput and ETA while it
// runs, the schedule whose run started it, its output and error files, and its jobs.

import { api } from "../api.js";
import { $, bar, duration, el, fillTable, link, number, numCell, shortJobLink, status, textCell, when } from "../dom.js";
import { batchFiles } from "../downloads.js";
import { act } from "../refresh.js";

const FINAL_BATCH_STATUSES = new Set(["completed", "failed", "expired", "cancelled"]);
const JOBS_SHOWN = 50;
const STATUS_ORDER = ["queued", "running", "succeeded", "failed", "cancelled"];

// The id comes from the address, read here; the server never writes it into the HTML.
function batchId() {
  return decodeURIComponent(location.pathname.split("/").pop());
}

const path = (suffix = "") => `/v1/batches/${encodeURIComponent(batchId())}${suffix}`;
const jobsHref = (extra = "") => `/dashboard/jobs?batch_id=${encodeURIComponent(batchId())}${extra}`;

export function setup() {
  $("#batch-cancel").addEventListener("click", () => act(() => api(path("/cancel"), { method: "POST" })));
}

function fields(list, pairs) {
  list.replaceChildren(...pairs.flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, value ?? "")]));
}

// When a final batch ended, whichever way it ended (OpenAI's batch object has one stamp per end).
function finishedAt(b) {
  return b.completed_at ?? b.failed_at ?? b.expired_at ?? b.cancelled_at ?? null;
}

function schedule(p) {
  if (p.schedule_id === null) return "none (created directly)";
  const name = `${p.schedule_name} (schedule ${p.schedule_id})`;
  return el("span", {}, link(`/dashboard/schedules?id=${p.schedule_id}`, name), `, its run for ${when(p.scheduled_for)}`);
}

function pace(b, p) {
  if (FINAL_BATCH_STATUSES.has(b.status)) return [["finished", when(finishedAt(b))]];
  const eta = p.eta_s === null ? "not yet known" : p.eta_s === 0 ? "finishing" : `${duration(p.eta_s * 1000)} left`;
  return [
    ["throughput", p.lines_per_s === null ? "none finished yet" : `${number(p.lines_per_s, 2)} lines/s since it started`],
    ["ETA", eta],
  ];
}

function jobRow(j) {
  const tokens = j.prompt_tokens === null ? "" : `${j.prompt_tokens} + ${j.completion_tokens ?? 0}`;
  return el(
    "tr",
    { "data-job": j.id },
    el("td", {}, shortJobLink(j.id)), // the batch is the context: the id's tail tells its jobs apart
    el("td", {}, status(j.status)),
    el("td", {}, j.snippet),
    el("td", {}, j.model),
    numCell(duration(j.run_ms)),
    numCell(tokens),
    textCell(j.error || ""),
  );
}

export async function load() {
  const [b, p, jobs] = await Promise.all([
    api(path()),
    api(path("/progress")),
    api(`/v1/jobs?batch_id=${encodeURIComponent(batchId())}&limit=${JOBS_SHOWN}`),
  ]);
  const endpoints = b.endpoints.length > 1 ? `mixed: ${b.endpoints.join(", ")}` : b.endpoint;
  fields($("#batch-fields"), [
    ["id", el("span", { class: "id" }, b.id)],
    ["status", status(b.status)],
    ["endpoint", endpoints],
    ["owner", b.owner || ""],
    ["created", when(b.created_at)],
    ["window", b.expires_at ? `${b.completion_window}, due ${when(b.expires_at)}` : b.completion_window],
    ["schedule", schedule(p)],
    ["input file", el("span", { class: "id" }, b.input_file_id)],
  ]);
  const c = b.request_counts;
  const done = c.completed + c.failed;
  $("#batch-bar").replaceChildren(bar(c.total ? done / c.total : 0, `${done} of ${c.total} lines done, ${c.failed} failed`));
  const counts = STATUS_ORDER.filter((s) => p.lines_by_status[s]).map((s) =>
    el("tr", { "data-status": s }, el("td", {}, status(s)), numCell(String(p.lines_by_status[s]))),
  );
  fillTable($("#batch-counts"), counts, "no lines");
  fields($("#batch-pace"), pace(b, p));
  $("#batch-cancel").hidden = FINAL_BATCH_STATUSES.has(b.status) || b.status === "cancelling";
  $("#batch-files").replaceChildren(batchFiles(b));
  fillTable($("#batch-jobs"), jobs.data.map(jobRow), "no jobs");
  $("#batch-jobs-note").replaceChildren(
    jobs.has_more ? el("span", {}, `(the newest ${JOBS_SHOWN}; `, link(jobsHref(), "all of them"), ")") : "",
  );
}
