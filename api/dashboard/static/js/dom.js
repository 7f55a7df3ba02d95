// Building the page from data.
//
// The rule: data reaches the DOM only as text (textContent, text nodes) and attributes set
// one by one, never parsed as HTML, so a job's prompt or error cannot inject markup.

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

// ---------------------------------------------------------------- tables

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

// ---------------------------------------------------------------- values in cells

// An ISO time, or seconds since the epoch, as "2024-05-01 12:00:00Z"; "" for none.
export function when(iso) {
  if (!iso) return "";
  const date = typeof iso === "number" ? new Date(iso * 1000) : new Date(iso);
  return date.toISOString().slice(0, 19).replace("T", " ") + "Z";
}

export function number(value, digits = 0) {
  return value === null || value === undefined ? "" : Number(value).toFixed(digits);
}

// A job, batch or worker status, coloured by app.css.
export function status(text) {
  return el("span", { class: `status status-${text}` }, text);
}

// A progress bar: `fraction` from 0 to 1.
export function bar(fraction, label) {
  const pct = Math.max(0, Math.min(1, fraction || 0)) * 100;
  return el(
    "div",
    { class: "bar", title: label },
    el("div", { class: "bar-fill", style: `width:${pct.toFixed(1)}%` }),
    el("span", {}, label),
  );
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
