// The status page, part 2 of 4: charts as inline SVG, drawn here.

const SVG = "http://www.w3.org/2000/svg";
const classColors = { "2xx": "#1a7f37", "3xx": "#8250df", "4xx": "#bf3989", "429": "#9a6700", "5xx": "#d1242f", timeout: "#e16f24", connection_error: "#57606a" };

function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text != null) e.textContent = text;
  return e;
}

function svgBox(svg, fallbackW, fallbackH) {
  const w = Math.max(40, Math.round(svg.clientWidth || svg.getBoundingClientRect().width || fallbackW));
  const h = Math.max(16, Math.round(svg.clientHeight || svg.getBoundingClientRect().height || fallbackH));
  svg.setAttribute("viewBox", "0 0 " + w + " " + h);
  svg.replaceChildren();
  return [w, h];
}

function niceMax(v) {
  if (v <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
  return 10 * p;
}

function pathOf(points, x, y) {
  let d = "";
  let prev = null;
  for (const [t, v] of points) {
    // A gap of more than three samples is drawn as a gap (the store could
    // not be read, or the tenant was not followed).
    const cmd = prev != null && t - prev <= chartGap ? "L" : "M";
    d += cmd + x(t).toFixed(1) + " " + y(v).toFixed(1);
    prev = t;
  }
  return d;
}

let chartGap = 6000; // set from the server's sample interval

// lineChart draws series [{name, color, points: [[t ms, value]], dash}]
// over [t0, t1], with a y axis from 0 and, optionally, a reference line
// (a capacity, a ceiling). It records how many points it drew.
function lineChart(svg, { series, t0, t1, fmt, ref, minMax }) {
  const [w, h] = svgBox(svg, 300, 120);
  const padL = 44, padR = 6, padT = 8, padB = 16;
  let max = minMax || 0;
  let count = 0;
  for (const s of series) for (const [, v] of s.points) max = Math.max(max, v);
  if (ref && ref.value != null) max = Math.max(max, ref.value);
  max = niceMax(max);
  const x = (t) => padL + ((w - padL - padR) * (t - t0)) / Math.max(1, t1 - t0);
  const y = (v) => h - padB - ((h - padT - padB) * v) / max;
  for (let i = 0; i <= 2; i++) {
    const v = (max * i) / 2, yy = y(v);
    svg.append(svgEl("line", { x1: padL, x2: w - padR, y1: yy, y2: yy, stroke: "#e3e6ea" }));
    svg.append(svgEl("text", { x: padL - 4, y: yy + 4, "text-anchor": "end", "font-size": 10, fill: "#5d6675" }, fmt(v)));
  }
  svg.append(svgEl("text", { x: padL, y: h - 3, "font-size": 10, fill: "#5d6675" }, "−" + fmtDelay(t1 - t0)));
  svg.append(svgEl("text", { x: w - padR, y: h - 3, "font-size": 10, fill: "#5d6675", "text-anchor": "end" }, "now"));
  if (ref && ref.value != null) {
    const yy = y(ref.value);
    svg.append(svgEl("line", { x1: padL, x2: w - padR, y1: yy, y2: yy, stroke: "#b3261e", "stroke-dasharray": "4 3" }));
    const below = yy - padT < 12; // at the top: the label goes under the line
    svg.append(svgEl("text", { x: w - padR - 2, y: below ? yy + 11 : yy - 3, "text-anchor": "end", "font-size": 10, fill: "#b3261e" }, ref.label));
  }
  for (const s of series) {
    const pts = s.points.filter(([t]) => t >= t0);
    count = Math.max(count, pts.length);
    if (pts.length === 0) continue;
    svg.append(svgEl("path", { d: pathOf(pts, x, y), fill: "none", stroke: s.color, "stroke-width": 1.8,
      "stroke-dasharray": s.dash || "", "stroke-linejoin": "round" }));
    if (pts.length === 1) svg.append(svgEl("circle", { cx: x(pts[0][0]), cy: y(pts[0][1]), r: 2, fill: s.color }));
  }
  if (count === 0) {
    svg.append(svgEl("text", { x: w / 2, y: h / 2, "text-anchor": "middle", "font-size": 11, fill: "#5d6675" }, "no samples yet"));
  }
  svg.dataset.points = String(count);
  svg.dataset.max = String(max);
}

// sparkline draws one small series with no axes, scaled to its box.
function sparkline(points, color, t0, t1, cls) {
  const w = 90, h = 22;
  const svg = svgEl("svg", { class: "spark " + (cls || ""), viewBox: "0 0 90 22", preserveAspectRatio: "none" });
  svg.dataset.points = String(points.length);
  let max = 1;
  for (const [, v] of points) max = Math.max(max, v);
  const x = (t) => 1 + ((w - 2) * (t - t0)) / Math.max(1, t1 - t0);
  const y = (v) => h - 2 - ((h - 4) * v) / max;
  svg.append(svgEl("line", { x1: 0, x2: w, y1: h - 1, y2: h - 1, stroke: "#e3e6ea", "vector-effect": "non-scaling-stroke" }));
  if (points.length > 0) {
    svg.append(svgEl("path", { d: pathOf(points, x, y), fill: "none", stroke: color, "stroke-width": 1.5, "vector-effect": "non-scaling-stroke" }));
  }
  return svg;
}
