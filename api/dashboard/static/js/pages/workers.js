// Workers and hosts: drain and undrain a worker or a whole host, unload a model from a worker.

import { api, has } from "../api.js";
import { $, ago, button, device, el, fillTable, gpusByUuid, jobLink, notAvailable, status, when } from "../dom.js";
import { act } from "../refresh.js";

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
  const [{ data: workers, drained_hosts: drainedHosts }, gpus] = await Promise.all([api("/v1/workers"), api("/v1/gpus")]);
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
        el("span", { title: when(w.last_heartbeat) }, ago(w.last_heartbeat)),
        el(
          "span",
          { class: "actions" },
          ownDrain
            ? button("Undrain", post(`/v1/workers/${name}/undrain`))
            : button("Drain", post(`/v1/workers/${name}/drain`)),
          ...held,
        ),
      ].map((c) => el("td", {}, c)),
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
}
