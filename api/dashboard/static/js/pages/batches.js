// Batches: progress of each (rate and ETA for the running ones), how many lines failed, when
// it finished; its output and error files to download; cancel. Each id opens the batch's page.

import { api } from "../api.js";
import { $, bar, button, duration, el, fillTable, link, number, numCell, status, when } from "../dom.js";
import { batchFiles } from "../downloads.js";
import { act } from "../refresh.js";

const FINAL_BATCH_STATUSES = new Set(["completed", "failed", "expired", "cancelled"]);

// Rate and ETA of a running batch, from gpuq's /progress.
function pace(progress) {
  if (!progress || progress.lines_per_s === null) return "";
  const eta = progress.eta_s === null ? "" : progress.eta_s === 0 ? ", finishing" : `, ${duration(progress.eta_s * 1000)} left`;
  return ` · ${number(progress.lines_per_s, 1)} lines/s${eta}`;
}

// When a final batch ended, whichever way it ended (OpenAI's batch object has one stamp per end).
function finishedAt(b) {
  return b.completed_at ?? b.failed_at ?? b.expired_at ?? b.cancelled_at ?? null;
}

// A batch's endpoint, "mixed" when its lines name several (each is answered in its own
// format); beneath it, its owner.
function endpointCell(b, beneath) {
  const endpoints = b.endpoints || [b.endpoint];
  if (endpoints.length < 2) return el("td", { class: "endpoint" }, el("span", { class: "name" }, b.endpoint), beneath);
  return el("td", { class: "endpoint", title: endpoints.join(", ") }, el("span", { class: "name" }, "mixed"), beneath);
}

export async function load() {
  const page = await api("/v1/batches?limit=100");
  const running = page.data.filter((b) => !FINAL_BATCH_STATUSES.has(b.status));
  const progress = new Map(
    await Promise.all(running.map(async (b) => [b.id, await api(`/v1/batches/${encodeURIComponent(b.id)}/progress`)])),
  );
  const rows = page.data.map((b) => {
    const c = b.request_counts;
    const done = c.completed + c.failed;
    const label = `${done} / ${c.total}${pace(progress.get(b.id))}`;
    const cancel = FINAL_BATCH_STATUSES.has(b.status)
      ? ""
      : button("Cancel", () => act(() => api(`/v1/batches/${encodeURIComponent(b.id)}/cancel`, { method: "POST" })));
    const sub = (...children) => el("span", { class: "small muted sub-line" }, ...children);
    const id = el("a", { href: `/dashboard/batches/${encodeURIComponent(b.id)}`, class: "id", title: b.id }, `…${b.id.slice(-8)}`);
    const finished = finishedAt(b);
    return el(
      "tr",
      { "data-batch": b.id },
      el("td", {}, id, sub(when(b.created_at))),
      el("td", {}, status(b.status), finished ? el("span", { class: "small muted sub-line finished" }, when(finished)) : ""),
      endpointCell(b, b.owner ? sub(b.owner) : ""),
      numCell(c.failed ? link(`/dashboard/jobs?batch_id=${encodeURIComponent(b.id)}&status=failed`, String(c.failed)) : "0"),
      el("td", { class: "progress" }, bar(c.total ? done / c.total : 0, label)),
      el("td", {}, el("span", { class: "actions" }, batchFiles(b), cancel)),
    );
  });
  fillTable($("#batches"), rows, "no batches");
}
