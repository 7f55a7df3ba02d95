// Schedules: the table (pause, resume, run now, edit), each one's last run with its outcome,
// the chosen schedule's next runs and history (each run's outcome beside its time), and a
// form that creates a schedule or edits one. Times are shown in the schedule's own time zone
// (its cron is read in it: "0 2 * * *" in Europe/Paris fires at 02:00 Paris time), with UTC in
// their title.

import { api, has } from "../api.js";
import { $, button, el, fillTable, row, showMessage, status, textCell, when, whenIn } from "../dom.js";
import { act, refresh } from "../refresh.js";

const HISTORY_RUNS = 20;

// The schedule whose History was clicked (or named by ?id= in the address); redrawn with the
// table on every refresh.
let chosenId = null;
// The schedule being edited in the form, or null while the form creates one.
let editing = null;

export function setup() {
  const id = Number(new URLSearchParams(location.search).get("id"));
  if (id) chosenId = id;
  const form = $("#schedule-form");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    let body;
    try {
      body = editing ? patchBody(form) : createBody(form);
    } catch (error) {
      return showMessage(error.message);
    }
    const call = editing
      ? api(`/v1/schedules/${editing.id}`, { method: "PATCH", body })
      : api("/v1/schedules", { method: "POST", body });
    act(async () => {
      const saved = await call;
      chosenId = saved.id;
      stopEditing();
    });
  });
  $("#schedule-form-cancel").addEventListener("click", stopEditing);
}

// ---------------------------------------------------------------- the form

function createBody(form) {
  const value = (name) => form.elements[name].value.trim();
  const body = {
    name: value("name"),
    cron: value("cron"),
    timezone: value("timezone"),
    endpoint: value("endpoint"),
    priority: value("priority"),
    misfire: value("misfire"),
    completion_window: value("completion_window"),
    enabled: form.elements.enabled.checked,
  };
  if (value("input_file_id")) body.input_file_id = value("input_file_id");
  else body.requests = parseLines(value("requests"));
  return body;
}

// Inline lines as the API takes them; a line that is not JSON is named before anything is sent.
function parseLines(text) {
  const lines = text.split("\n").filter((l) => l.trim());
  if (!lines.length) throw new Error("give the schedule an input file or at least one request line");
  return lines.map((line, i) => {
    try {
      return JSON.parse(line);
    } catch {
      throw new Error(`request line ${i + 1} is not JSON: ${line.slice(0, 60)}`);
    }
  });
}

// What an edit may change: when it runs, at which priority, what a missed run does, the window
// its runs' batches have, enabled.
function patchBody(form) {
  const value = (name) => form.elements[name].value.trim();
  return {
    cron: value("cron"),
    timezone: value("timezone"),
    priority: value("priority"),
    misfire: value("misfire"),
    completion_window: value("completion_window"),
    enabled: form.elements.enabled.checked,
  };
}

function startEditing(s) {
  editing = s;
  const form = $("#schedule-form");
  for (const name of ["name", "cron", "timezone", "priority", "misfire", "completion_window", "endpoint"]) {
    form.elements[name].value = s[name];
  }
  form.elements.enabled.checked = s.enabled;
  form.elements.input_file_id.value = s.input_file_id || "";
  form.elements.requests.value = "";
  for (const name of ["name", "input_file_id", "requests", "endpoint"]) form.elements[name].disabled = true;
  $("#schedule-form-title").textContent = `Edit schedule ${s.id} (${s.name})`;
  $("#schedule-submit").textContent = "Save changes";
  $("#schedule-form-cancel").hidden = false;
  $("#schedule-form-note").hidden = false;
  form.scrollIntoView({ block: "nearest" });
}

function stopEditing() {
  editing = null;
  const form = $("#schedule-form");
  form.reset();
  for (const field of form.elements) field.disabled = false;
  $("#schedule-form-title").textContent = "Create a schedule";
  $("#schedule-submit").textContent = "Create schedule";
  $("#schedule-form-cancel").hidden = true;
  $("#schedule-form-note").hidden = true;
}

// The batch files a new schedule may read, newest first (kept while the form is in use).
async function offerFiles() {
  if (!has("/v1/files")) return;
  const select = $("#schedule-form").elements.input_file_id;
  const files = await api("/v1/files?purpose=batch&limit=100");
  const chosen = select.value;
  const options = files.data.map((f) => el("option", { value: f.id }, `${f.filename} (${f.id})`));
  select.replaceChildren(select.options[0], ...options);
  select.value = chosen;
}

// ---------------------------------------------------------------- the table and history

// A run's outcome: the batch it started and how that went, or why it started none.
function outcome(run, batch) {
  if (run.error) return el("span", { class: "outcome" }, status("failed"), " did not start");
  if (!run.batch_id) return el("span", { class: "outcome muted" }, "nothing to run");
  if (!batch) return el("span", { class: "outcome" }, status(run.batch_status || "unknown"));
  const c = batch.request_counts;
  const counts = `${c.completed + c.failed} of ${c.total} lines${c.failed ? `, ${c.failed} failed` : ""}`;
  return el("span", { class: "outcome" }, status(batch.status), ` ${counts}`);
}

async function batchesOf(runs) {
  const ids = [...new Set(runs.map((r) => r.batch_id).filter(Boolean))];
  const found = await Promise.all(ids.map((id) => api(`/v1/batches/${encodeURIComponent(id)}`).catch(() => null)));
  return new Map(ids.map((id, i) => [id, found[i]]));
}

function batchLink(id) {
  return id ? el("a", { href: `/dashboard/batches/${encodeURIComponent(id)}`, class: "id" }, `…${id.slice(-6)}`) : "";
}

export async function load() {
  const [page] = await Promise.all([api("/v1/schedules"), offerFiles()]);
  const lastRuns = await Promise.all(page.data.map((s) => api(`/v1/schedules/${s.id}/runs?limit=1`)));
  const last = lastRuns.map((runs) => runs.data[0] || null);
  const batches = await batchesOf(last.filter(Boolean));
  const post = (s, verb) => () => act(() => api(`/v1/schedules/${s.id}/${verb}`, { method: "POST" }));
  const rows = page.data.map((s, i) =>
    el(
      "tr",
      { "data-schedule": s.id },
      el("td", {}, String(s.id)),
      el("td", { class: "name" }, s.name, el("span", { class: "sub-line small muted" }, `${s.enabled ? "enabled" : "paused"} · ${s.priority} · ${s.completion_window} window`)),
      el("td", { class: "cron" }, el("span", { class: "cron-expr" }, s.cron), el("span", { class: "sub-line small muted" }, s.timezone)),
      zoned(s.next_fire_at, s.timezone, "next"),
      lastRunCell(s, last[i], batches),
      el(
        "td",
        {},
        el(
          "span",
          { class: "actions" },
          button("History", () => {
            chosenId = s.id;
            refresh();
          }),
          button("Edit", () => startEditing(s)),
          s.enabled ? button("Pause", post(s, "pause")) : button("Resume", post(s, "resume")),
          button("Run now", post(s, "run")),
        ),
      ),
    ),
  );
  fillTable($("#schedules"), rows, "no schedules");
  const chosen = page.data.find((s) => s.id === chosenId);
  if (chosen) await drawSchedule(chosen);
}

// The last run's time, in the schedule's zone, and beneath it its outcome.
function lastRunCell(s, run, batches) {
  if (!run) return el("td", { "data-time": "last" }, "never run");
  return el(
    "td",
    { title: when(run.fire_time), "data-time": "last" },
    whenIn(run.fire_time, s.timezone),
    el("span", { class: "sub-line small" }, outcome(run, batches.get(run.batch_id))),
  );
}

// A cell with a time in the schedule's zone, its UTC form in the title.
function zoned(iso, zone, name) {
  return el("td", { title: when(iso), "data-time": name }, whenIn(iso, zone));
}

async function drawSchedule(s) {
  const [next, runs] = await Promise.all([
    api(`/v1/schedules/${s.id}/preview`),
    api(`/v1/schedules/${s.id}/runs?limit=${HISTORY_RUNS}`),
  ]);
  const batches = await batchesOf(runs.data);
  $("#schedule-detail").hidden = false;
  $("#schedule-name").textContent = `${s.name} (${next.cron}, ${next.timezone})`;
  $("#schedule-next").replaceChildren(...next.next.map((t) => el("li", { title: when(t) }, whenIn(t, next.timezone))));
  fillTable(
    $("#schedule-runs"),
    runs.data.map((r) =>
      row(
        zoned(r.fire_time, next.timezone, "fire"),
        el("td", {}, outcome(r, batches.get(r.batch_id))),
        r.trigger,
        batchLink(r.batch_id),
        textCell(r.error || ""),
      ),
    ),
    "not run yet",
  );
}
