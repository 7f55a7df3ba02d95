// A line chart drawn by hand as inline SVG (no chart library, nothing from a CDN): one
// polyline per series, a legend, and labels for the top value and the first and last times.

import { when } from "./dom.js";

// An XML namespace, not an address anything is fetched from.
const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

// series: [{name, css, points: [{t, v}]}], t in milliseconds since the epoch; `css` is the
// class that colours the line and its legend entry.
export function lineChart(series, { width = 480, height = 150 } = {}) {
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
