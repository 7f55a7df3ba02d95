// Jobs: a table filtered by the form above it, a page at a time. The form's fields are the
// API's query parameters, and live in the address (/dashboard/jobs?status=failed) with the
// page's cursor (`after`), so a view can be shared.

import { api, query } from "../api.js";
import { $, device, duration, el, fillTable, gpusByUuid, jobLink, numCell, status, textCell, when } from "../dom.js";
import { refresh } from "../refresh.js";

const PAGE_SIZE = 50;

// The cursors of the pages seen, newest first: pages[i] is the `after` that gives page i
// (null: the newest page). The API pages forward only, so "newer" walks back this list;
// after a reload it holds just the newest page and the one in the address.
let pages = [null];
let current = 0;
// Whether pages[i] is really the i-th page: not after a reload on a later page, until the
// newest page has been shown again (which re-reads the cursors from there).
let numbered = true;

function jobFilters() {
  const form = $("#job-filter");
  return Object.fromEntries([...new FormData(form)].filter(([, v]) => v !== ""));
}

// The address says the filter and the page, so a reload or a shared link shows the same.
function showInAddress() {
  history.replaceState(null, "", `${location.pathname}${query({ ...jobFilters(), after: pages[current] })}`);
}

function goTo(index) {
  current = index;
  showInAddress();
  refresh();
}

export function setup() {
  const form = $("#job-filter");
  const address = new URLSearchParams(location.search);
  for (const field of form.elements) if (field.name && address.has(field.name)) field.value = address.get(field.name);
  if (address.get("after")) {
    pages = [null, address.get("after")];
    current = 1;
    numbered = false;
  }
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    pages = [null]; // a new filter starts at its newest page
    goTo(0);
  });
  form.addEventListener("reset", () => {
    pages = [null];
    current = 0;
    history.replaceState(null, "", location.pathname);
    setTimeout(refresh); // after the browser has cleared the fields
  });
  $("#jobs-newest").addEventListener("click", () => goTo(0));
  $("#jobs-newer").addEventListener("click", () => goTo(Math.max(0, current - 1)));
  $("#jobs-older").addEventListener("click", () => goTo(current + 1));
}

// Today's times as "07:30:46Z", older ones with their date: the column stays narrow (the
// full time is the cell's title).
function shortWhen(iso) {
  const full = when(iso);
  return full.slice(0, 10) === when(new Date().toISOString()).slice(0, 10) ? full.slice(11) : full.slice(0, 16) + "Z";
}

// A running job's figures so far: its elapsed time, and its tokens from its token stream
// (only jobs of streaming calls have one); a finished job's own figures otherwise.
function runCell(j) {
  if (j.status !== "running" || !j.started_at) return numCell(duration(j.run_ms));
  const elapsed = Date.now() - new Date(j.started_at).getTime();
  return el("td", { class: "num so-far", title: `started ${when(j.started_at)}` }, `${duration(Math.max(0, elapsed))} so far`);
}

function tokensCell(j) {
  if (j.prompt_tokens === null) return numCell("");
  if (j.status === "running") {
    const generated = j.tokens_so_far === null ? "…" : `${j.tokens_so_far} so far`;
    return el("td", { class: "num so-far" }, `${j.prompt_tokens} + ${generated}`);
  }
  return numCell(`${j.prompt_tokens} + ${j.completion_tokens ?? 0}`);
}

// The batch a job answers a line of, as its id's tail linking to the batch's jobs.
function batchCell(j) {
  if (!j.batch_id) return el("td", {}, "");
  const a = el("a", { href: `/dashboard/jobs?batch_id=${encodeURIComponent(j.batch_id)}`, class: "id" }, `…${j.batch_id.slice(-6)}`);
  a.title = j.batch_id;
  return el("td", { class: "batch" }, a);
}

function jobRow(j, gpus) {
  return el(
    "tr",
    { "data-job": j.id },
    el("td", {}, jobLink(j.id)),
    el("td", {}, status(j.status), el("span", { class: "small muted sub-line" }, j.priority)),
    el("td", {}, j.model, el("span", { class: "small muted sub-line" }, j.kind)),
    el("td", { class: "text snippet" }, j.snippet),
    batchCell(j),
    el("td", {}, j.owner || ""),
    el("td", { title: when(j.created_at) }, shortWhen(j.created_at)),
    numCell(duration(j.queue_wait_ms)),
    runCell(j),
    tokensCell(j),
    el("td", {}, device(j.device, gpus)),
    textCell(j.error || ""),
  );
}

export async function load() {
  const [page, gpus] = await Promise.all([
    api(`/v1/jobs${query({ ...jobFilters(), limit: PAGE_SIZE, after: pages[current] })}`),
    api("/v1/gpus"),
  ]);
  if (page.has_more) pages[current + 1] = page.next_after;
  if (current === 0) numbered = true;
  const byUuid = gpusByUuid(gpus.data);
  fillTable(
    $("#jobs"),
    page.data.map((j) => jobRow(j, byUuid)),
    current ? "no older jobs match" : "no jobs match",
  );
  const first = current * PAGE_SIZE + 1;
  const which = numbered ? `jobs ${first}–${first + page.data.length - 1}` : "older jobs";
  $("#jobs-range").textContent = page.data.length
    ? `${which}, newest first${page.has_more ? "" : "; no older ones"}`
    : "";
  $("#jobs-newest").disabled = current === 0;
  $("#jobs-newer").disabled = current === 0;
  $("#jobs-older").disabled = !page.has_more;
}
