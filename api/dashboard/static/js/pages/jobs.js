// Jobs: a table filtered by the form above it, a page at a time. The form's fields are the
// API's query parameters, and live in the address (/dashboard/jobs?status=failed) with the
// page's cursor (`after`), so a view can be shared.

import { api, query } from "../api.js";
import { $, device, duration, el, fillTable, gpusByUuid, numCell, shortJobLink, status, textCell, when } from "../dom.js";
import { refresh } from "../refresh.js";

const PAGE_SIZE = 50;
const FINAL = new Set(["succeeded", "failed", "cancelled"]);

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

const sub = (...children) => el("span", { class: "small muted sub-line" }, ...children);

// A running job's time so far; a finished job's run time. Beneath: how long it waited, and
// where it ran.
function runCell(j, gpus) {
  const running = j.status === "running" && j.started_at;
  const elapsed = running ? Math.max(0, Date.now() - new Date(j.started_at).getTime()) : null;
  const time = running ? `${duration(elapsed)} so far` : duration(j.run_ms);
  const waited = j.queue_wait_ms === null ? "" : `waited ${duration(j.queue_wait_ms)}`;
  return el(
    "td",
    { class: `num run${running ? " so-far" : ""}`, title: running ? `started ${when(j.started_at)}` : null },
    time,
    waited ? sub(waited) : "",
    j.device ? sub(device(j.device, gpus)) : "",
  );
}

// Prompt and completion tokens; a running job's completion so far, from its token stream
// (only jobs of streaming calls have one).
function tokensCell(j) {
  if (j.prompt_tokens === null) return numCell("");
  if (j.status === "running") {
    const generated = j.tokens_so_far === null ? "…" : `${j.tokens_so_far} so far`;
    return el("td", { class: "num tokens so-far" }, `${j.prompt_tokens} + ${generated}`);
  }
  return el("td", { class: "num tokens" }, `${j.prompt_tokens} + ${j.completion_tokens ?? 0}`);
}

// Its status and priority; beneath, how it stands with its deadline, if it gave one: "due in
// 59 min", "late 3.0 s" (red: unfinished past it), or once it ended "in time" or "ended late".
// Relative, so the line stays as narrow as a time of day whatever the date (800 px); the
// deadline itself is the line's title.
function deadlineLine(j) {
  const due = new Date(j.deadline).getTime();
  const title = `deadline ${when(j.deadline)}`;
  const line = (text, late) => el("span", { class: `small sub-line deadline ${late ? "late" : "muted"}`, title }, text);
  if (FINAL.has(j.status)) {
    const ended = j.finished_at ? new Date(j.finished_at).getTime() : due;
    return line(ended <= due ? "in time" : "ended late", false);
  }
  const left = due - Date.now();
  return left > 0 ? line(`due in ${duration(left)}`, false) : line(`late ${duration(-left)}`, true);
}

function statusCell(j) {
  return el("td", {}, status(j.status), sub(j.priority), j.deadline ? deadlineLine(j) : "");
}

// What it asks (its custom_id or the start of its prompt); beneath, the batch it answers a line of.
function askedCell(j) {
  const batch = j.batch_id
    ? sub("batch ", el("a", { href: `/dashboard/batches/${encodeURIComponent(j.batch_id)}`, class: "id", title: j.batch_id }, `…${j.batch_id.slice(-6)}`))
    : "";
  return el("td", { class: "text asked" }, el("span", { class: "snippet" }, j.snippet), batch);
}

// Seven columns, secondary figures beneath the main ones, so the table fits 800 px.
function jobRow(j, gpus) {
  return el(
    "tr",
    { "data-job": j.id },
    el("td", { title: when(j.created_at) }, shortJobLink(j.id), sub(shortWhen(j.created_at))),
    statusCell(j),
    el("td", {}, j.model, sub(`${j.kind}${j.owner ? ` · ${j.owner}` : ""}`)),
    askedCell(j),
    runCell(j, gpus),
    tokensCell(j),
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
