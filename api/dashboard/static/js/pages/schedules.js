// Schedules: the table (pause, resume, run now), and the chosen schedule's next runs and
// history below it. Times are shown in the schedule's own time zone (its cron is read in
// it: "0 2 * * *" in Europe/Paris fires at 02:00 Paris time), with UTC in their title.

import { api } from "../api.js";
import { $, button, el, fillTable, row, status, textCell, when, whenIn } from "../dom.js";
import { act, refresh } from "../refresh.js";

// The schedule whose History was clicked; redrawn with the table on every refresh.
let chosenSchedule = null;

export async function load() {
  const page = await api("/v1/schedules");
  const post = (s, verb) => () => act(() => api(`/v1/schedules/${s.id}/${verb}`, { method: "POST" }));
  const rows = page.data.map((s) =>
    el(
      "tr",
      { "data-schedule": s.id },
      ...[String(s.id), s.name, s.cron, s.timezone, s.enabled ? "yes" : "paused"].map((c) => el("td", {}, c)),
      zoned(s.next_fire_at, s.timezone, "next"),
      zoned(s.last_fired_at, s.timezone, "last"),
      el("td", {}, s.priority),
      el(
        "td",
        {},
        el(
          "span",
          { class: "actions" },
          button("History", () => {
            chosenSchedule = s;
            refresh();
          }),
          s.enabled ? button("Pause", post(s, "pause")) : button("Resume", post(s, "resume")),
          button("Run now", post(s, "run")),
        ),
      ),
    ),
  );
  fillTable($("#schedules"), rows, "no schedules");
  if (chosenSchedule) await drawSchedule(chosenSchedule);
}

// A cell with a time in the schedule's zone, its UTC form in the title.
function zoned(iso, zone, name) {
  return el("td", { title: when(iso), "data-time": name }, whenIn(iso, zone));
}

async function drawSchedule(s) {
  const [next, runs] = await Promise.all([
    api(`/v1/schedules/${s.id}/preview`),
    api(`/v1/schedules/${s.id}/runs`),
  ]);
  $("#schedule-detail").hidden = false;
  $("#schedule-name").textContent = `${s.name} (${next.cron}, ${next.timezone})`;
  $("#schedule-next").replaceChildren(...next.next.map((t) => el("li", { title: when(t) }, whenIn(t, next.timezone))));
  fillTable(
    $("#schedule-runs"),
    runs.data.map((r) =>
      row(
        zoned(r.fire_time, next.timezone, "fire"),
        r.trigger,
        r.batch_id ? el("a", { href: `/dashboard/jobs?batch_id=${encodeURIComponent(r.batch_id)}`, class: "id" }, r.batch_id) : "",
        r.batch_status ? status(r.batch_status) : "",
        textCell(r.error || ""),
      ),
    ),
    "not run yet",
  );
}
