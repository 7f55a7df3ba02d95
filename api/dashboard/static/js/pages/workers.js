// Workers and hosts: drain and undrain a worker or a whole host, unload a model from a worker;
// how often each slot's worker was restarted, and the events that say why.

import { api, has } from "../api.js";
import { $, ago, button, device, el, fillTable, gpusByUuid, jobLink, notAvailable, status, when } from "../dom.js";
import { eventRows } from "../events.js";
import { act } from "../refresh.js";

// Restarts of the worker's supervisor slot: a restarted worker has a new name and jobs done at
// 0, so this (and the events below) is what says it crashed.
function restartsCell(n) {
  const attrs = { class: `num restarts${n ? " restarts-some" : ""}` };
  return el("td", attrs, n ? `${n} restart${n === 1 ? "" : "s"}` : "0");
}

// "2 of 4 slots busy": a worker decodes up to `slots` jobs of one model together.
function slotsText(w) {
  return el("span", { class: "small slots" }, `${w.slots_busy} of ${w.slots} slot${w.slots === 1 ? "" : "s"} busy`);
}

// Every job running on the worker, one link a line.
function runningJobs(ids) {
  const links = ids.map((id) => el("div", {}, jobLink(id)));
  return el("span", { class: "running" }, ...links);
}

export async function load() {
  if (!has("/v1/workers")) {
    notAvailable($("#workers"), "/v1/workers");
    return notAvailable($("#hosts"), "/v1/workers");
  }
  const [{ data: workers, drained_hosts: drainedHosts }, gpus, events] = await Promise.all([
    api("/v1/workers"),
    api("/v1/gpus"),
    has("/v1/events") ? api("/v1/events?limit=30") : null,
  ]);
  const byUuid = gpusByUuid(gpus.data);
  const post = (path, body) => () => act(() => api(path, { method: "POST", body }));
  const rows = workers.map((w) => {
    const name = encodeURIComponent(w.name);
    // Undrain offers to lift only the worker's own drain; a drained host is undrained below.
    const ownDrain = w.drained_by.includes("worker");
    const held = w.loaded_models.map((m) => button(`Unload ${m}`, post(`/v1/workers/${name}/unload`, { model: m })));
    return el(
      "tr",
      { "data-worker": w.name },
      ...[
        w.name,
        w.host,
        el("span", { class: "worker-state" }, status(w.state), slotsText(w)),
        device(w.device, byUuid),
        el("span", { class: "list" }, w.loaded_models.join(", ")),
        runningJobs(w.running_jobs),
        String(w.jobs_done),
        restartsCell(w.restarts),
        el("span", { title: when(w.last_heartbeat) }, ago(w.last_heartbeat)),
        el(
          "span",
          { class: "actions" },
          ownDrain
            ? button("Undrain", post(`/v1/workers/${name}/undrain`))
            : button("Drain", post(`/v1/workers/${name}/drain`)),
          ...held,
        ),
      ].map((c) => (c instanceof Node && c.tagName === "TD" ? c : el("td", {}, c))),
    );
  });
  fillTable($("#workers"), rows, "no workers running");

  // Hosts: those with live workers, and drained ones that have none now.
  const hosts = [...new Set([...workers.map((w) => w.host), ...drainedHosts])].sort();
  const hostRows = hosts.map((host) => {
    const drained = drainedHosts.includes(host);
    const path = `/v1/hosts/${encodeURIComponent(host)}/${drained ? "undrain" : "drain"}`;
    return el(
      "tr",
      { "data-host": host },
      ...[
        host,
        String(workers.filter((w) => w.host === host).length),
        drained ? "yes" : "no",
        button(drained ? "Undrain host" : "Drain host", post(path)),
      ].map((c) => el("td", {}, c)),
    );
  });
  fillTable($("#hosts"), hostRows, "no hosts");
  if (events) fillTable($("#worker-events"), eventRows(events.data, byUuid), "no events recorded");
  else notAvailable($("#worker-events"), "/v1/events");
}
