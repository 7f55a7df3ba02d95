// gpuq dashboard: one small module, no dependencies.
//
// The HTML pages hold no data. This script asks for an admin key once, keeps it in this
// tab's sessionStorage, and reads everything from the JSON API with
// `Authorization: Bearer <key>`. Each page has a `load` function that redraws its data;
// it runs every REFRESH_MS while the tab is visible, so the page stays live without a reload.
// Data goes into the DOM only as text (textContent), never as HTML.

const KEY_STORAGE = "gpuq.adminKey";
const REFRESH_MS = 5000;
const FINAL_JOB_STATUSES = new Set(["succeeded", "failed", "cancelled"]);
const FINAL_BATCH_STATUSES = new Set(["completed", "failed", "expired", "cancelled"]);

// ---------------------------------------------------------------- API calls

class ApiError extends Error {
  constructor(status, detail) {
    super(detail);
    this.status = status;
  }
}

async function api(path, { method = "GET", body } = {}) {
  const headers = { Authorization: `Bearer ${sessionStorage.getItem(KEY_STORAGE) || ""}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 204) return null;
  const data = await response.json().catch(() => null);
  if (!response.ok) {
    throw new ApiError(response.status, (data && data.detail) || `${method} ${path}: HTTP ${response.status}`);
  }
  return data;
}

function query(params) {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    for (const v of [].concat(value)) if (v !== "" && v !== null && v !== undefined) search.append(name, v);
  }
  const text = search.toString();
  return text ? `?${text}` : "";
}

// Which endpoints this server has, from its own OpenAPI document. Pages ask before calling
// an optional endpoint, so a missing one shows a "not available" note instead of a 404.
let endpoints = new Set();

async function loadEndpoints() {
  const response = await fetch("/openapi.json");
  const spec = response.ok ? await response.json() : { paths: {} };
  endpoints = new Set(Object.keys(spec.paths || {}));
}

const has = (path) => endpoints.has(path);

// ---------------------------------------------------------------- DOM helpers

const $ = (selector) => document.querySelector(selector);

// el("td", { class: "x" }, "text", otherNode): children that are not nodes become text.
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value !== null && value !== undefined && value !== false) node.setAttribute(name, value);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(child ?? ""));
  }
  return node;
}

function link(href, text) {
  return el("a", { href }, text);
}

function button(text, onclick, attrs = {}) {
  return el("button", { type: "button", ...attrs, onclick }, text);
}

// Replaces a table's body; `empty` is shown in one wide cell when there are no rows.
function fillTable(table, rows, empty = "none") {
  const body = table.tBodies[0];
  if (rows.length) body.replaceChildren(...rows);
  else body.replaceChildren(el("tr", { class: "empty" }, el("td", { colspan: table.tHead.rows[0].cells.length }, empty)));
}

function row(...cells) {
  return el("tr", {}, ...cells.map((c) => (c instanceof Node && c.tagName === "TD" ? c : el("td", {}, c))));
}

function when(iso) {
  if (!iso) return "";
  const date = typeof iso === "number" ? new Date(iso * 1000) : new Date(iso);
  return date.toISOString().slice(0, 19).replace("T", " ") + "Z";
}

function number(value, digits = 0) {
  return value === null || value === undefined ? "" : Number(value).toFixed(digits);
}

function status(text) {
  return el("span", { class: `status status-${text}` }, text);
}

// Said where an optional endpoint is missing: in a table's body, or in place of a box's content.
function notAvailable(container, endpoint) {
  const text = `Not available: this server has no ${endpoint} endpoint yet.`;
  if (container.tagName === "TABLE") fillTable(container, [], text);
  else container.replaceChildren(el("p", { class: "note" }, text));
}

function showMessage(text, kind = "error") {
  const box = $("#message");
  box.textContent = text;
  box.className = `message message-${kind}`;
  box.hidden = !text;
}

// A progress bar: `fraction` from 0 to 1.
function bar(fraction, label) {
  const pct = Math.max(0, Math.min(1, fraction || 0)) * 100;
  return el("div", { class: "bar", title: label }, el("div", { class: "bar-fill", style: `width:${pct.toFixed(1)}%` }), el("span", {}, label));
}

// A line chart drawn by hand as inline SVG: one polyline per series, a legend, and labels
// for the top value and the first and last times. series: [{name, css, points: [{t, v}]}].
const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function lineChart(series, { width = 480, height = 150 } = {}) {
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "line-chart" });
  const points = series.flatMap((s) => s.points);
  if (points.length < 2) {
    chart.append(svg("text", { x: 10, y: height / 2 }, "not enough data yet"));
    return chart;
  }
  const pad = 24;
  const times = points.map((p) => p.t);
  const [t0, t1] = [Math.min(...times), Math.max(...times)];
  const top = Math.max(1, ...points.map((p) => p.v));
  const x = (t) => pad + ((t - t0) / (t1 - t0 || 1)) * (width - 2 * pad);
  const y = (v) => height - pad - (v / top) * (height - 2 * pad);
  series.forEach((s, i) => {
    const coords = s.points.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(" ");
    chart.append(svg("polyline", { points: coords, class: s.css }));
    chart.append(svg("text", { x: width - pad - 90, y: 12 + 12 * i, class: s.css }, `— ${s.name}`));
  });
  chart.append(svg("text", { x: 2, y: pad }, String(top)));
  chart.append(svg("text", { x: 2, y: height - pad }, "0"));
  chart.append(svg("text", { x: pad, y: height - 4 }, when(t0 / 1000).slice(11, 16)));
  chart.append(svg("text", { x: width - pad - 30, y: height - 4 }, when(t1 / 1000).slice(11, 16)));
  return chart;
}

// Runs an action from a button; its error, if any, goes to the message line.
async function act(action, done) {
  try {
    await action();
    showMessage("");
    await (done || refresh)();
  } catch (error) {
    showMessage(error.message);
  }
}

// ---------------------------------------------------------------- pages

async function loadOverview() {
  const [gpus, workers] = await Promise.all([api("/v1/gpus"), has("/v1/workers") ? api("/v1/workers") : null]);
  drawGpus(gpus.data, workers && workers.data);
  await Promise.all([drawSummary(), drawQueues(), drawThroughput(), drawFailures()]);
}

// Models loaded on each GPU, by UUID, from the workers pinned to it.
function modelsByGpu(workers) {
  const models = new Map();
  for (const w of workers || []) {
    for (const uuid of w.gpu_uuids) models.set(uuid, [...(models.get(uuid) || []), ...w.loaded_models]);
  }
  return models;
}

function drawGpus(gpus, workers) {
  const models = modelsByGpu(workers);
  const cards = gpus.map((g) => {
    const used = g.memory_free_mib === null ? null : g.memory_total_mib - g.memory_free_mib;
    const memory =
      used === null
        ? el("p", { class: "muted" }, `${g.memory_total_mib} MiB, no live reading`)
        : bar(used / g.memory_total_mib, `${used} / ${g.memory_total_mib} MiB`);
    const loaded = workers === null ? "" : `models: ${[...new Set(models.get(g.uuid) || [])].join(", ") || "none loaded"}`;
    return el(
      "div",
      { class: `card${g.healthy ? "" : " unhealthy"}`, "data-uuid": g.uuid },
      el("h3", {}, `${g.host} / ${g.index}: ${g.name}`),
      memory,
      el(
        "p",
        {},
        `${g.temperature_c ?? "–"} °C · ${g.power_w === null ? "–" : number(g.power_w, 0)} W · `,
        `${g.utilisation_pct ?? "–"} % busy · ${g.live ? "live" : "no telemetry"}`,
      ),
      el("p", { class: "small models" }, loaded),
      g.healthy
        ? ""
        : el(
            "p",
            { class: "error" },
            `unhealthy: ${g.unhealthy_reason || ""} `,
            button("Clear", () =>
              act(() => api(`/v1/gpus/${encodeURIComponent(g.uuid)}/clear`, { method: "POST" })),
            ),
          ),
    );
  });
  const box = $("#gpus");
  if (cards.length) box.replaceChildren(...cards);
  else box.replaceChildren(el("p", { class: "muted" }, "No GPUs registered: workers run on the CPU."));
}

async function drawSummary() {
  const box = $("#summary");
  if (!has("/v1/stats/summary")) return notAvailable(box, "/v1/stats/summary");
  const s = await api("/v1/stats/summary");
  const f = s.finished;
  const parts = [
    `Now: ${s.in_flight.queued ?? 0} queued, ${s.in_flight.running ?? 0} running.`,
    `Last hour: ${f.succeeded ?? 0} succeeded, ${f.failed ?? 0} failed, ${f.cancelled ?? 0} cancelled;`,
    `queue wait p50 ${number(s.queue_wait.p50_ms)} ms, p95 ${number(s.queue_wait.p95_ms)} ms;`,
    `run p50 ${number(s.run_time.p50_ms)} ms;`,
    s.usage.tokens_per_s === null ? "" : `${number(s.usage.tokens_per_s, 1)} tokens/s;`,
    s.usage.energy_jobs ? `${number(s.usage.energy_j / 3600, 2)} Wh.` : "",
  ];
  box.textContent = parts.filter(Boolean).join(" ");
}

async function drawQueues() {
  const table = $("#queues");
  if (!has("/v1/stats/queues")) return notAvailable(table, "/v1/stats/queues");
  const queues = (await api("/v1/stats/queues")).data;
  const rows = ["high", "normal", "low"].map((priority) => {
    const mine = queues.filter((q) => q.priority === priority && q.depth > 0);
    const waited = Math.max(0, ...mine.map((q) => q.front_waiting_s || 0));
    return el(
      "tr",
      { "data-priority": priority },
      ...[
        priority,
        String(mine.reduce((sum, q) => sum + q.depth, 0)),
        mine.length ? `${number(waited, 1)} s` : "",
        mine.map((q) => `${q.model} ${q.kind}: ${q.depth}`).join(", "),
      ].map((c) => el("td", {}, c)),
    );
  });
  fillTable(table, rows);
}

async function drawThroughput() {
  const box = $("#throughput");
  if (!has("/v1/stats/throughput")) return notAvailable(box, "/v1/stats/throughput");
  const series = await api("/v1/stats/throughput");
  const perMinute = 60 / series.bucket_s;
  const at = (p) => new Date(p.start).getTime();
  box.replaceChildren(
    lineChart([
      { name: "finished", css: "finished", points: series.data.map((p) => ({ t: at(p), v: p.jobs_per_min })) },
      { name: "failed", css: "failed", points: series.data.map((p) => ({ t: at(p), v: p.failed * perMinute })) },
    ]),
  );
}

async function drawFailures() {
  const [failed, reasons] = await Promise.all([
    api(`/v1/jobs${query({ status: "failed", limit: 10 })}`),
    has("/v1/stats/failures") ? api("/v1/stats/failures?top=10") : null,
  ]);
  const jobLink = (id) => link(`/dashboard/jobs/${encodeURIComponent(id)}`, id);
  fillTable(
    $("#failures"),
    failed.data.map((j) => row(when(j.finished_at), jobLink(j.id), j.model, j.error || "")),
    "no failed jobs",
  );
  if (reasons === null) return notAvailable($("#failure-reasons"), "/v1/stats/failures");
  fillTable(
    $("#failure-reasons"),
    reasons.data.map((r) => row(String(r.jobs), r.reason, jobLink(r.latest_job_id))),
    "no failures in the last hour",
  );
}

// Jobs: the filter form's fields are the API's query parameters, and live in the address.
function jobFilters() {
  const form = $("#job-filter");
  return Object.fromEntries([...new FormData(form)].filter(([, v]) => v !== ""));
}

function setupJobs() {
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

async function loadJobs() {
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

function jobId() {
  return decodeURIComponent(location.pathname.split("/").pop());
}

function setupJob() {
  const actions = { cancel: "/cancel", retry: "/retry", requeue: "/requeue" };
  for (const [name, suffix] of Object.entries(actions)) {
    const control = $(`#job-actions [data-action="${name}"]`);
    const path = `/v1/jobs/{job_id}${suffix}`;
    control.hidden = !has(path);
    control.addEventListener("click", () =>
      act(() => api(`/v1/jobs/${encodeURIComponent(jobId())}${suffix}`, { method: "POST" })),
    );
  }
}

function fields(list, pairs) {
  list.replaceChildren(...pairs.flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, value ?? "")]));
}

function promptText(request) {
  if (request.prompt !== undefined) return request.prompt;
  if (request.messages) return request.messages.map((m) => `${m.role}: ${m.content}`).join("\n\n");
  if (request.input) return request.input.join("\n---\n");
  return JSON.stringify(request, null, 2);
}

function resultText(result) {
  if (!result) return "";
  if (result.text !== undefined) return result.text;
  // Embeddings: a few numbers of each vector are enough to see them.
  if (result.embeddings) {
    return result.embeddings
      .map((v, i) => `[${i}] ${v.slice(0, 8).map((x) => x.toFixed(4)).join(", ")}, … (${result.dimensions} dimensions)`)
      .join("\n");
  }
  return JSON.stringify(result, null, 2);
}

async function loadJob() {
  const id = encodeURIComponent(jobId());
  const [j, deliveries] = await Promise.all([api(`/v1/jobs/${id}`), api(`/v1/webhooks/deliveries?job_id=${id}`)]);
  document.title = `gpuq · ${j.id}`;
  fields($("#job-fields"), [
    ["id", j.id],
    ["status", status(j.status)],
    ["kind", j.kind],
    ["model", j.model],
    ["priority", j.priority],
    ["owner", j.owner],
    ["batch", j.batch_id ? link(`/dashboard/jobs?batch_id=${encodeURIComponent(j.batch_id)}`, j.batch_id) : ""],
    ["worker", j.worker],
    ["device", j.device],
    ["host", j.host],
    ["attempts", String(j.attempts)],
    ["error", j.error],
  ]);
  fields($("#job-timings"), [
    ["created", when(j.created_at)],
    ["started", when(j.started_at)],
    ["finished", when(j.finished_at)],
    ["queue wait", j.queue_wait_ms === null ? "" : `${j.queue_wait_ms} ms`],
    ["model load", j.load_ms === null ? "" : `${j.load_ms} ms`],
    ["run", j.run_ms === null ? "" : `${j.run_ms} ms`],
    ["tokens", j.prompt_tokens === null ? "" : `${j.prompt_tokens} prompt + ${j.completion_tokens ?? 0} completion`],
    ["GPU seconds", number(j.gpu_seconds, 2)],
    ["energy", j.energy_j === null ? "" : `${number(j.energy_j, 1)} J`],
  ]);
  $("#job-prompt").textContent = promptText(j.request);
  $("#job-result").textContent = resultText(j.result);
  // Cancel and requeue act on unfinished jobs; retry on failed or cancelled ones.
  const final = FINAL_JOB_STATUSES.has(j.status);
  $('#job-actions [data-action="cancel"]').disabled = final;
  $('#job-actions [data-action="requeue"]').disabled = final;
  $('#job-actions [data-action="retry"]').disabled = !final || j.status === "succeeded";
  fillTable(
    $("#job-webhooks"),
    deliveries.data.map((d) =>
      row(d.event, d.url, status(d.status), String(d.attempts), d.last_error || String(d.last_status_code ?? ""), when(d.delivered_at)),
    ),
    j.request.webhook_url ? "none yet" : "no webhook_url on this job",
  );
}

// Rate and ETA of a running batch, from gpuq's /progress.
function pace(progress) {
  if (!progress || progress.lines_per_s === null) return "";
  const eta =
    progress.eta_s === null ? "" : progress.eta_s === 0 ? ", finishing" : `, about ${Math.ceil(progress.eta_s / 60)} min left`;
  return ` · ${number(progress.lines_per_s, 1)} lines/s${eta}`;
}

async function loadBatches() {
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

// Schedules: the table, and the chosen schedule's next runs and history below it.
let chosenSchedule = null;

async function loadSchedules() {
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

// Affinity rules: list, a form that creates or edits one, and the placement preview.
const RULE_LISTS = ["gpu_indices", "gpu_uuids"];
const RULE_NUMBERS = ["precedence", "min_memory_mib"];
const RULE_TEXTS = ["model_pattern", "kind", "effect", "gpu_name_pattern", "host_pattern"];

function ruleGpus(r) {
  const parts = [];
  if (r.gpu_indices) parts.push(`indices ${r.gpu_indices.join(",")}`);
  if (r.gpu_uuids) parts.push(`UUIDs ${r.gpu_uuids.join(",")}`);
  if (r.gpu_name_pattern) parts.push(`name ${r.gpu_name_pattern}`);
  if (r.host_pattern) parts.push(`host ${r.host_pattern}`);
  if (r.min_memory_mib) parts.push(`≥ ${r.min_memory_mib} MiB`);
  return parts.join("; ") || "all GPUs";
}

function ruleBody(form) {
  const value = (name) => form.elements[name].value.trim();
  const body = {};
  for (const name of RULE_TEXTS) body[name] = value(name) || null;
  for (const name of RULE_NUMBERS) body[name] = value(name) === "" ? null : Number(value(name));
  body.precedence = body.precedence ?? 0;
  for (const name of RULE_LISTS) {
    const items = value(name).split(",").map((s) => s.trim()).filter(Boolean);
    body[name] = items.length ? (name === "gpu_indices" ? items.map(Number) : items) : null;
  }
  return body;
}

function editRule(r) {
  const form = $("#rule-form");
  form.reset();
  form.elements.id.value = r ? r.id : "";
  if (r) {
    for (const name of [...RULE_TEXTS, ...RULE_NUMBERS]) form.elements[name].value = r[name] ?? "";
    for (const name of RULE_LISTS) form.elements[name].value = (r[name] || []).join(",");
  }
  $("#rule-form-title").textContent = r ? `Edit rule ${r.id}` : "New rule";
  $("#rule-save").textContent = r ? "Save rule" : "Create rule";
  $("#rule-warnings").replaceChildren();
}

function setupRules() {
  const form = $("#rule-form");
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const id = form.elements.id.value;
    act(async () => {
      const saved = await api(id ? `/v1/affinity-rules/${id}` : "/v1/affinity-rules", {
        method: id ? "PUT" : "POST",
        body: ruleBody(form),
      });
      editRule(null);
      $("#rule-warnings").replaceChildren(...saved.warnings.map((w) => el("li", {}, `rule ${saved.rule.id}: ${w}`)));
    });
  });
  $("#rule-new").addEventListener("click", () => editRule(null));
  $("#preview-form").addEventListener("submit", (event) => {
    event.preventDefault();
    act(drawPreview, async () => {});
  });
  api("/v1/models")
    .then((models) => {
      $("#preview-model").replaceChildren(...models.data.map((m) => el("option", {}, m.id)));
    })
    .catch((error) => showMessage(error.message));
}

async function drawPreview() {
  const form = $("#preview-form");
  const result = await api(`/v1/affinity-rules/preview${query({ model: form.elements.model.value, kind: form.elements.kind.value })}`);
  $("#preview-summary").textContent = result.summary;
  fillTable(
    $("#preview"),
    result.gpus.map((g) =>
      row(`${g.host} / ${g.index}: ${g.name}`, g.may_run ? "yes" : "no", g.allowed ? "yes" : "no", g.fits ? "yes" : "no", g.reasons.join("; ")),
    ),
    "no GPUs registered",
  );
}

async function loadRules() {
  const rules = await api("/v1/affinity-rules");
  const rows = rules.data.map((r) =>
    el(
      "tr",
      { "data-rule": r.id },
      ...[
        String(r.id),
        r.model_pattern,
        r.kind || "any",
        r.effect,
        String(r.precedence),
        ruleGpus(r),
        el(
          "span",
          { class: "actions" },
          button("Edit", () => editRule(r)),
          button("Delete", () => act(() => api(`/v1/affinity-rules/${r.id}`, { method: "DELETE" }))),
        ),
      ].map((c) => el("td", {}, c)),
    ),
  );
  fillTable($("#rules"), rows, "no rules: every model may run on every GPU it fits");
}

async function loadWorkers() {
  if (!has("/v1/workers")) {
    notAvailable($("#workers"), "/v1/workers");
    return notAvailable($("#hosts"), "/v1/workers");
  }
  const { data: workers, drained_hosts: drainedHosts } = await api("/v1/workers");
  const post = (path, body) => () => act(() => api(path, { method: "POST", body }));
  const rows = workers.map((w) => {
    const name = encodeURIComponent(w.name);
    const ownDrain = w.drained_by.includes("worker");
    const held = w.loaded_models.map((m) => button(`Unload ${m}`, post(`/v1/workers/${name}/unload`, { model: m })));
    return el(
      "tr",
      { "data-worker": w.name },
      ...[
        w.name,
        w.host,
        status(w.state),
        w.device,
        w.loaded_models.join(", "),
        w.current_job ? link(`/dashboard/jobs/${encodeURIComponent(w.current_job)}`, w.current_job) : "",
        String(w.jobs_done),
        when(w.last_heartbeat),
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

const PAGES = {
  overview: { load: loadOverview },
  jobs: { setup: setupJobs, load: loadJobs },
  job: { setup: setupJob, load: loadJob },
  batches: { load: loadBatches },
  schedules: { load: loadSchedules },
  rules: { setup: setupRules, load: loadRules },
  workers: { load: loadWorkers },
};

// ---------------------------------------------------------------- refresh and sign-in

const page = PAGES[document.body.dataset.page];
let refreshing = null;

// One refresh at a time: a click during a poll waits for it rather than racing it.
async function refresh() {
  if (refreshing) return refreshing;
  refreshing = (async () => {
    try {
      await page.load();
      $("#updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
      if ($("#message").classList.contains("message-stale")) showMessage("");
    } catch (error) {
      handleError(error);
    } finally {
      refreshing = null;
    }
  })();
  return refreshing;
}

function handleError(error) {
  if (error instanceof ApiError && error.status === 401) {
    signOut("The key is no longer valid (unknown or revoked). Sign in again.");
  } else if (error instanceof ApiError && error.status === 403) {
    signOut("This key is not an admin key: the dashboard needs an admin key.");
  } else {
    showMessage(`Could not refresh: ${error.message}`, "stale");
  }
}

function showSignIn(message) {
  $("#page").hidden = true;
  $("#sign-out").hidden = true;
  $("#sign-in").hidden = false;
  showMessage(message || "");
}

function signOut(message) {
  sessionStorage.removeItem(KEY_STORAGE);
  $("#who").textContent = "";
  showSignIn(message);
}

// Listeners are added once; enter() runs again after each sign-in.
function init() {
  for (const a of document.querySelectorAll("nav a")) {
    const current = document.body.dataset.page === "job" ? "jobs" : document.body.dataset.page;
    if (a.dataset.nav === current) a.classList.add("current");
  }
  $("#sign-in-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_STORAGE, $("#key").value.trim());
    $("#key").value = "";
    enter();
  });
  $("#sign-out").addEventListener("click", () => signOut("Signed out."));
  enter();
}

let polling = false;

async function enter() {
  if (!sessionStorage.getItem(KEY_STORAGE)) return showSignIn();
  // Any valid key may read /v1/keys/me; checking the role first means a submitter's key
  // gets one clear sentence, not a page of 403s.
  let me;
  try {
    me = await api("/v1/keys/me");
  } catch (error) {
    return signOut(error instanceof ApiError && error.status === 401 ? `This key was refused: ${error.message}` : error.message);
  }
  if (me.role !== "admin") {
    return signOut(`This key is not an admin key (it is a ${me.role} key for "${me.owner}"): the dashboard needs an admin key.`);
  }
  $("#who").textContent = `${me.name} (${me.owner})`;
  $("#sign-in").hidden = true;
  $("#sign-out").hidden = false;
  $("#page").hidden = false;
  showMessage("");
  if (!polling) {
    polling = true;
    await loadEndpoints();
    if (page.setup) page.setup();
    setInterval(() => {
      if (!document.hidden && sessionStorage.getItem(KEY_STORAGE)) refresh();
    }, REFRESH_MS);
  }
  await refresh();
}

init();
