// Charts drawn by hand as inline SVG (no chart library, nothing from a CDN): a line chart
// (one polyline per series, a legend above the plot, the top value, time ticks), and sparklines (one small series over a fixed window, with gaps where nothing
// was read).

import { el, mib, number, when } from "./dom.js";

// An XML namespace, not an address anything is fetched from.
const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

// Time between x ticks: the first step giving at most 7 ticks over `span` milliseconds.
const MINUTE = 60_000;
const TICK_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 360, 720, 1440].map((m) => m * MINUTE);
const tickStep = (span) => TICK_STEPS.find((step) => span / step <= 7) || TICK_STEPS[TICK_STEPS.length - 1];

// series: [{name, css, points: [{t, v}]}], t in milliseconds since the epoch; `css` is the
// class that colours the line and its legend entry. The legend sits above the plot, never on
// it; x ticks every few minutes (UTC, as every time in the dashboard); a series that is 0
// throughout is not drawn over the axis but said in the legend ("failed: none").
export function lineChart(series, { width = 640, height = 180 } = {}) {
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "line-chart" });
  const points = series.flatMap((s) => s.points);
  if (points.length < 2) {
    chart.append(svg("text", { x: 10, y: height / 2 }, "not enough data yet"));
    return chart;
  }
  const [left, right, top, bottom] = [30, 16, 24, 20];
  const [plotWidth, plotHeight] = [width - left - right, height - top - bottom];
  const times = points.map((p) => p.t);
  const [t0, t1] = [Math.min(...times), Math.max(...times)];
  const highest = Math.max(1, ...points.map((p) => p.v));
  const x = (t) => left + ((t - t0) / (t1 - t0 || 1)) * plotWidth;
  const y = (v) => top + plotHeight - (v / highest) * plotHeight;
  const axis = top + plotHeight;
  chart.append(svg("line", { x1: left, y1: axis, x2: left + plotWidth, y2: axis, class: "axis" }));
  chart.append(svg("line", { x1: left, y1: top, x2: left, y2: axis, class: "axis" }));
  chart.append(svg("text", { x: left - 4, y: top + 4, "text-anchor": "end", class: "y-label" }, Number.isInteger(highest) ? String(highest) : number(highest, 1)));
  chart.append(svg("text", { x: left - 4, y: axis + 4, "text-anchor": "end", class: "y-label" }, "0"));
  const step = tickStep(t1 - t0);
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
    chart.append(svg("line", { x1: x(t), y1: axis, x2: x(t), y2: axis + 4, class: "axis" }));
    chart.append(svg("text", { x: x(t), y: height - 4, "text-anchor": "middle", class: "x-tick" }, when(t / 1000).slice(11, 16)));
  }
  let legendX = left;
  for (const s of series) {
    const drawn = s.points.some((p) => p.v > 0);
    if (drawn) {
      const coords = s.points.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(" ");
      chart.append(svg("polyline", { points: coords, class: s.css }));
    }
    const label = drawn ? `— ${s.name}` : `${s.name}: none`;
    chart.append(svg("text", { x: legendX, y: 12, class: `legend ${s.css}` }, label));
    legendX += 12 + 7 * label.length;
  }
  return chart;
}

// One series over the window [since, until] (milliseconds since the epoch), scaled to `top`
// (or its own maximum): points [{t, v}], v null where nothing was read, drawn as gaps. The
// time axis is the window, not the points, so a line that starts late says when it started.
export function sparkline(points, { since, until, top, width = 240, height = 36 }) {
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "sparkline", preserveAspectRatio: "none" });
  const read = points.filter((p) => p.v !== null && p.v !== undefined);
  const highest = top || Math.max(1, ...read.map((p) => p.v));
  const x = (t) => ((t - since) / (until - since || 1)) * width;
  const y = (v) => height - 2 - (Math.min(v, highest) / highest) * (height - 4);
  // Consecutive readings make one polyline; a missing one ends it.
  let run = [];
  const segments = [run];
  for (const p of points) {
    if (p.v === null || p.v === undefined) segments.push((run = []));
    else run.push(`${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`);
  }
  for (const segment of segments) {
    // A lone reading is drawn as a short dash, so it shows.
    const coords = segment.length === 1 ? [segment[0], segment[0].replace(/^[\d.]+/, (n) => String(Number(n) + 2))] : segment;
    if (coords.length) chart.append(svg("polyline", { points: coords.join(" ") }));
  }
  return chart;
}

// The hour's history of one GPU, as the overview's cards and the GPUs page show it: a
// sparkline per measure, with its latest value, or "no readings" where the GPU reports none
// (a simulated GPU has no utilisation or power).
export function gpuHistoryRows(g, series, window) {
  const since = new Date(window.since).getTime();
  const until = new Date(window.until).getTime();
  const measures = [
    ["utilisation", "utilization_pct", 100, (v) => `${number(v, 0)} %`],
    ["memory", "memory_used_mib", g.memory_total_mib, mib],
    ["power", "power_w", null, (v) => `${number(v, 0)} W`],
  ];
  return measures.map(([name, field, top, format]) => {
    const points = series.map((p) => ({ t: new Date(p.start).getTime(), v: p[field] }));
    const read = points.filter((p) => p.v !== null);
    const latest = read.length ? format(read[read.length - 1].v) : "no readings";
    return el(
      "div",
      { class: "history-row", "data-measure": name },
      el("span", { class: "history-name" }, name),
      read.length ? sparkline(points, { since, until, top }) : el("span", { class: "history-none" }),
      el("span", { class: `history-value${read.length ? "" : " muted"}` }, latest),
    );
  });
}
