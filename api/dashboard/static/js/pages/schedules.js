// Schedules: the table (pause, resume, run now), and the chosen schedule's next runs and
// history below it.

import { api } from "../api.js";
import { $, button, el, fillTable, link, row, when } from "../dom.js";
import { act, refresh } from "../refresh.js";

// The schedule whose History was clicked; redrawn with the table on every refresh.
let chosenSchedule = null;

export async function load() {
  const page = await api("/v1/schedules");
  const post = (s, verb) => () => act(() => api(`/v1/schedules/${s.id}/${verb}`, { method: "POST" }));
  const rows = page.data.map((s) =>
    row(
      String(s.id),
      s.name,
      s.cron,
      s.timezone,
      s.enabled ? "yes" : "paused",
      when(s.next_fire_at),
      when(s.last_fired_at),
      s.priority,
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
  );
  fillTable($("#schedules"), rows, "no schedules");
  if (chosenSchedule) await drawSchedule(chosenSchedule);
}

async function drawSchedule(s) {
  const [next, runs] = await Promise.all([
    api(`/v1/schedules/${s.id}/preview`),
    api(`/v1/schedules/${s.id}/runs`),
  ]);
  $("#schedule-detail").hidden = false;
  $("#schedule-name").textContent = `${s.name} (${next.cron}, ${next.timezone})`;
  $("#schedule-next").replaceChildren(...next.next.map((t) => el("li", {}, when(t))));
  fillTable(
    $("#schedule-runs"),
    runs.data.map((r) =>
      row(
        when(r.fire_time),
        r.trigger,
        r.batch_id ? link(`/dashboard/jobs?batch_id=${encodeURIComponent(r.batch_id)}`, r.batch_id) : "",
        r.batch_status || "",
        r.error || "",
      ),
    ),
    "not run yet",
  );
}
