// Batches: progress of each, with rate and ETA for the running ones; cancel.

import { api } from "../api.js";
import { $, bar, button, el, fillTable, link, number, row, status, when } from "../dom.js";
import { act } from "../refresh.js";

const FINAL_BATCH_STATUSES = new Set(["completed", "failed", "expired", "cancelled"]);

// Rate and ETA of a running batch, from gpuq's /progress.
function pace(progress) {
  if (!progress || progress.lines_per_s === null) return "";
  const eta =
    progress.eta_s === null ? "" : progress.eta_s === 0 ? ", finishing" : `, about ${Math.ceil(progress.eta_s / 60)} min left`;
  return ` · ${number(progress.lines_per_s, 1)} lines/s${eta}`;
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
    const label = `${done} / ${c.total}${c.failed ? ` (${c.failed} failed)` : ""}${pace(progress.get(b.id))}`;
    const cancel = FINAL_BATCH_STATUSES.has(b.status)
      ? ""
      : button("Cancel", () => act(() => api(`/v1/batches/${encodeURIComponent(b.id)}/cancel`, { method: "POST" })));
    return row(
      link(`/dashboard/jobs?batch_id=${encodeURIComponent(b.id)}`, b.id),
      status(b.status),
      b.endpoint,
      b.owner || "",
      when(b.created_at),
      el("td", {}, bar(c.total ? done / c.total : 0, label)),
      el("td", {}, cancel),
    );
  });
  fillTable($("#batches"), rows, "no batches");
}
