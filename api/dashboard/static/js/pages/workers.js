// Workers and hosts: drain and undrain a worker or a whole host, unload a model from a worker;
// how often each slot's worker was restarted, and the events that say why.
//
// One row per worker, in five columns so that it fits 800 px: the worker (its host or GPUs
// beneath), its state (slots busy, heartbeat beneath), its models (each with its Unload), the
// jobs running on it (short ids), jobs done (its slot's restarts beneath), and Drain.

import { api, has } from "../api.js";
import {
  $,
  ago,
  button,
  device,
  el,
  fillTable,
  gpusByUuid,
  notAvailable,
  shortJobLink,
  status,
  when,
} from "../dom.js";
import { eventRows } from "../events.js";
import { act } from "../refresh.js";

const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
const post = (path, body) => () => act(() => api(path, { method: "POST", body }));

// The worker's name; beneath, where it runs: its GPUs' places, or its host for a CPU worker.
function workerCell(w, gpus) {
  const where = w.gpu_uuids.length ? device(w.device, gpus) : `${w.host} · ${w.device || "cpu"}`;
  return el("td", {}, w.name, el("span", { class: "worker-host small muted" }, where));
}

// idle, busy, draining or drained; "2 of 4 slots busy" (a worker decodes up to `slots` jobs of
// one model together); when it last sent a heartbeat.
function stateCell(w) {
  return el(
    "td",
    { class: "worker-state" },
    status(w.state),
    el("span", { class: "small slots" }, `${w.slots_busy} of ${plural(w.slots, "slot")} busy`),
    el("span", { class: "small heartbeat muted", title: when(w.last_heartbeat) }, `heartbeat ${ago(w.last_heartbeat)}`),
  );
}

const mib = (bytes) => `${Math.round(bytes / 2 ** 20)} MiB`;

// Each loaded model with the button that unloads it from this worker; beneath, its prefix
// cache: prompt starts kept in host RAM (and on disk) beyond its slots, and how often they served.
function modelsCell(w) {
  const name = encodeURIComponent(w.name);
  const lines = w.loaded_models.map((m) =>
    el(
      "div",
      { class: "loaded-model" },
      m,
      button("Unload", post(`/v1/workers/${name}/unload`, { model: m }), { title: `unload ${m} from this worker` }),
    ),
  );
  return el("td", { class: "list" }, ...lines, ...prefixCacheLine(w.prefix_cache));
}

// Short lines, one a fact, so that the column still fits 800 px: what RAM keeps, what disk keeps,
// and how often a start was found.
function prefixCacheLine(c) {
  if (!c || (!c.ram_limit_bytes && !c.disk_enabled)) return [];
  const line = (text) => el("span", { class: "small prefix-cache muted" }, text);
  const ram = line(`cache: ${plural(c.ram_entries, "start")}, ${mib(c.ram_bytes)} of ${mib(c.ram_limit_bytes)}`);
  const disk = c.disk_enabled ? [line(`disk: ${plural(c.disk_entries, "start")}, ${mib(c.disk_bytes)}`)] : [];
  const served = line(`${plural(c.hits_ram + c.hits_disk, "hit")}, ${c.misses} ${c.misses === 1 ? "miss" : "misses"}`);
  return [ram, ...disk, served];
}

// Every job running on the worker, one short link a line (the full id is its title).
function runningCell(ids) {
  return el("td", { class: "running" }, ...ids.map((id) => el("div", {}, shortJobLink(id))));
}

// Jobs this process has run; beneath, restarts of its supervisor slot: a restarted worker has a
// new name and jobs done at 0, so this (and the events below) is what says it crashed.
function doneCell(w) {
  const restarts = el("span", { class: `small restarts${w.restarts ? " restarts-some" : ""}` }, plural(w.restarts, "restart"));
  return el("td", { class: "num" }, String(w.jobs_done), restarts);
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
  const rows = workers.map((w) => {
    const name = encodeURIComponent(w.name);
    // Undrain offers to lift only the worker's own drain; a drained host is undrained below.
    const drain = w.drained_by.includes("worker")
      ? button("Undrain", post(`/v1/workers/${name}/undrain`))
      : button("Drain", post(`/v1/workers/${name}/drain`));
    return el(
      "tr",
      { "data-worker": w.name },
      workerCell(w, byUuid),
      stateCell(w),
      modelsCell(w),
      runningCell(w.running_jobs),
      doneCell(w),
      el("td", {}, el("span", { class: "actions" }, drain)),
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
