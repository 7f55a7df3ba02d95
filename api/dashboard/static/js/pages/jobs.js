// Jobs: a table filtered by the form above it. The form's fields are the API's query
// parameters, and live in the address (/dashboard/jobs?status=failed) so a view can be shared.

import { api, query } from "../api.js";
import { $, el, fillTable, link, number, status, when } from "../dom.js";
import { refresh } from "../refresh.js";

function jobFilters() {
  const form = $("#job-filter");
  return Object.fromEntries([...new FormData(form)].filter(([, v]) => v !== ""));
}

export function setup() {
  const form = $("#job-filter");
  const current = new URLSearchParams(location.search);
  for (const field of form.elements) if (field.name && current.has(field.name)) field.value = current.get(field.name);
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    history.replaceState(null, "", `${location.pathname}${query(jobFilters())}`);
    refresh();
  });
  form.addEventListener("reset", () => {
    history.replaceState(null, "", location.pathname);
    setTimeout(refresh); // after the browser has cleared the fields
  });
}

export async function load() {
  const page = await api(`/v1/jobs${query({ ...jobFilters(), limit: 100 })}`);
  const rows = page.data.map((j) =>
    el(
      "tr",
      { "data-job": j.id },
      ...[
        link(`/dashboard/jobs/${encodeURIComponent(j.id)}`, j.id),
        status(j.status),
        j.kind,
        j.model,
        j.priority,
        j.owner || "",
        when(j.created_at),
        number(j.queue_wait_ms),
        number(j.run_ms),
        j.prompt_tokens === null ? "" : `${j.prompt_tokens} + ${j.completion_tokens ?? 0}`,
        j.device || "",
        j.error || "",
      ].map((c) => el("td", {}, c)),
    ),
  );
  fillTable($("#jobs"), rows, "no jobs match");
  $("#jobs-more").textContent = page.has_more ? "Showing the newest 100; narrow the filter to see others." : "";
}
