// Building the page from data.
//
// The rule: data reaches the DOM only as text (textContent, text nodes) and attributes set
// one by one, never parsed as HTML, so a job's prompt or error cannot inject markup. No
// inline styles either (a strict Content-Security-Policy forbids them): a width is set
// through the CSSOM (`node.style.width`), which such a policy allows.

export const $ = (selector) => document.querySelector(selector);

// el("td", { class: "x" }, "text", otherNode): children that are not nodes become text;
// attributes named on* become event listeners; null, undefined and false ones are left out.
export function el(tag, attrs = {}, ...children) {
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

export function link(href, text) {
  return el("a", { href }, text);
}

export function button(text, onclick, attrs = {}) {
  return el("button", { type: "button", ...attrs, onclick }, text);
}

export const jobHref = (id) => `/dashboard/jobs/${encodeURIComponent(id)}`;

// A job id as a link, in the monospace face ids are shown in.
export function jobLink(id) {
  return el("a", { href: jobHref(id), class: "id" }, id);
}

// A job id is long ("job_" + its submission time + random hex digits); its random tail
// tells the few jobs on one GPU or worker apart. The full id is the link's title.
export function shortJobLink(id) {
  const a = el("a", { href: jobHref(id), class: "id" }, `…${id.slice(-6)}`);
  a.title = id;
  return a;
}

// ---------------------------------------------------------------- tables
//
// Cells hold one line each (app.css: ids, names, numbers and times never wrap); a cell of
// free text (an error, a reason) is made with `textCell()` and wraps between words.

// Replaces a table's body; `empty` is shown in one wide cell when there are no rows.
export function fillTable(table, rows, empty = "none") {
  const body = table.tBodies[0];
  if (rows.length) body.replaceChildren(...rows);
  else body.replaceChildren(el("tr", { class: "empty" }, el("td", { colspan: table.tHead.rows[0].cells.length }, empty)));
}

// A row of cells; a cell given as a <td> is used as it is, anything else is wrapped in one.
export function row(...cells) {
  return el("tr", {}, ...cells.map((c) => (c instanceof Node && c.tagName === "TD" ? c : el("td", {}, c))));
}

// A cell of free text, which may wrap between words (and inside a token too long for it).
export function textCell(value) {
  return el("td", { class: "text" }, value ?? "");
}

// A number or duration, right-aligned.
export function numCell(value) {
  return el("td", { class: "num" }, value ?? "");
}

// ---------------------------------------------------------------- values, in human units

// An ISO time, or seconds since the epoch, as "2024-05-01 12:00:00Z"; "" for none.
export function when(iso) {
  if (!iso) return "";
  const date = typeof iso === "number" ? new Date(iso * 1000) : new Date(iso);
  return date.toISOString().slice(0, 19).replace("T", " ") + "Z";
}

// The same moment in the IANA time zone `zone`: "2024-05-01 14:00 CEST" (a schedule's times
// are read in its own zone, as its cron is).
export function whenIn(iso, zone) {
  if (!iso) return "";
  const format = new Intl.DateTimeFormat("en-GB", {
    timeZone: zone,
    year: "numeric",
    month: "2-digit",
    day: "2-digit",
    hour: "2-digit",
    minute: "2-digit",
    hourCycle: "h23",
    timeZoneName: "short",
  });
  const part = Object.fromEntries(format.formatToParts(new Date(iso)).map((p) => [p.type, p.value]));
  return `${part.year}-${part.month}-${part.day} ${part.hour}:${part.minute} ${part.timeZoneName}`;
}

// How long ago an ISO time was: "just now", "4.0 s ago", "3.5 min ago".
export function ago(iso) {
  if (!iso) return "";
  const ms = Date.now() - new Date(iso).getTime();
  return ms < 1000 ? "just now" : `${duration(ms)} ago`;
}

export function number(value, digits = 0) {
  return value === null || value === undefined ? "" : Number(value).toFixed(digits);
}

// One decimal below 10, none above: 1.2, 14.
const figure = (value) => (value < 10 ? value.toFixed(1) : value.toFixed(0));

// Milliseconds as people read them: "850 ms", "1.2 s", "14 s", "3.5 min", "2 h"; "" for none.
export function duration(ms) {
  if (ms === null || ms === undefined) return "";
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const seconds = ms / 1000;
  if (seconds < 60) return `${figure(seconds)} s`;
  if (seconds < 3600) return `${figure(seconds / 60)} min`;
  return `${figure(seconds / 3600)} h`;
}

// MiB as "837 MiB" or "14 GiB" (a "1.5 GiB" below 10).
export function mib(value) {
  if (value === null || value === undefined) return "";
  return value < 1024 ? `${Math.round(value)} MiB` : `${figure(value / 1024).replace(/\.0$/, "")} GiB`;
}

// Joules as "12 J", "3.4 Wh" or "1.2 kWh".
export function energy(joules) {
  if (joules === null || joules === undefined) return "";
  if (joules < 3600) return `${figure(joules)} J`;
  const wh = joules / 3600;
  return wh < 1000 ? `${figure(wh)} Wh` : `${figure(wh / 1000)} kWh`;
}

// A job's device ("cpu", "cuda:<uuid>[,<uuid>]", "simulated:<uuid>") as its GPUs' places,
// "vm / 2", where `gpus` (uuid -> GPU from /v1/gpus) knows them; the full label is the title.
export function device(label, gpus) {
  if (!label) return "";
  const [kind, uuids] = label.includes(":") ? label.split(/:(.*)/s) : [label, ""];
  if (!uuids) return el("span", { title: label }, kind);
  const places = uuids.split(",").map((uuid) => {
    const gpu = gpus.get(uuid);
    return gpu ? `${gpu.host} / ${gpu.index}` : uuid;
  });
  return el("span", { title: label }, `${places.join(" + ")}${kind === "simulated" ? " (sim)" : ""}`);
}

// GPUs by UUID, for `device()`.
export function gpusByUuid(gpus) {
  return new Map(gpus.map((g) => [g.uuid, g]));
}

// A job, batch or worker status, coloured by app.css.
export function status(text) {
  return el("span", { class: `status status-${text}` }, text);
}

// A progress bar: `fraction` from 0 to 1.
export function bar(fraction, label) {
  const pct = Math.max(0, Math.min(1, fraction || 0)) * 100;
  const fill = el("div", { class: "bar-fill" });
  fill.style.width = `${pct.toFixed(1)}%`; // the CSSOM, not a style attribute: see the top
  return el("div", { class: "bar", title: label }, fill, el("span", {}, label));
}

// ---------------------------------------------------------------- messages

// Said where an optional endpoint is missing: in a table's body, or in place of a box's content.
export function notAvailable(container, endpoint) {
  const text = `Not available: this server has no ${endpoint} endpoint yet.`;
  if (container.tagName === "TABLE") fillTable(container, [], text);
  else container.replaceChildren(el("p", { class: "note" }, text));
}

// The message line under the header; "" hides it. `kind` "stale" marks a failed refresh,
// which the next good one clears.
export function showMessage(text, kind = "error") {
  const box = $("#message");
  box.textContent = text;
  box.className = `message message-${kind}`;
  box.hidden = !text;
}
