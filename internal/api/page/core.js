// The status page, part 1 of 4 (core.js, charts.js, views.js, app.js,
// served as one script: /static/app.js): the API client, the connection
// state, formatting and small DOM helpers. No build step, no library.
"use strict";

const $ = (id) => document.getElementById(id);

// Unreachable is thrown when the server cannot be reached: no answer at
// all, or a gateway's 502/504 (the page may sit behind a proxy).
class Unreachable extends Error {}

// ApiError is an answer with a status the caller did not expect.
class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || "HTTP " + status);
    this.status = status;
    this.body = body || {};
  }
}

const conn = {
  token: sessionStorage.getItem("throttlerToken") || "",
  lastOk: 0,          // when the server last answered
  downSince: 0,       // when it stopped answering (0: it answers)
};

// api calls the API with the token and decodes the JSON answer. It throws
// Unreachable or ApiError; ok lists the statuses that are not errors.
async function api(method, path, ok = [200]) {
  const headers = conn.token ? { Authorization: "Bearer " + conn.token } : {};
  let resp;
  try {
    resp = await fetch(path, { method, headers, cache: "no-store" });
  } catch (e) {
    throw new Unreachable(String(e));
  }
  let body = null;
  try { body = await resp.json(); } catch (e) { body = null; }
  if (resp.status === 502 || resp.status === 504 || (resp.status === 503 && !body)) {
    throw new Unreachable("HTTP " + resp.status + " from a proxy");
  }
  if (!ok.includes(resp.status)) throw new ApiError(resp.status, body);
  return body;
}

function setToken(t) {
  conn.token = t;
  if (t) sessionStorage.setItem("throttlerToken", t); else sessionStorage.removeItem("throttlerToken");
}

// setConn shows the connection's state in the header and the banner.
function setConn(state, text) {
  const pill = $("conn");
  pill.dataset.state = state;
  pill.textContent = text;
  const banner = $("banner");
  if (state === "unreachable") {
    if (!conn.downSince) conn.downSince = Date.now();
    banner.textContent = "Server unreachable since " + fmtClock(conn.downSince) +
      (conn.lastOk ? "; the numbers below are from " + fmtClock(conn.lastOk) : "") + ". Retrying every 2 s.";
    banner.dataset.show = "1";
    document.body.dataset.stale = "1";
    return;
  }
  conn.downSince = 0;
  banner.dataset.show = "";
  banner.textContent = "";
  document.body.dataset.stale = "";
}

function notice(text, bad) {
  const n = $("notice");
  n.textContent = text;
  n.dataset.kind = bad ? "bad" : "";
}

function fmtClock(ms) { return new Date(ms).toLocaleTimeString([], { hour12: false }); }

function fmtDelay(ms) {
  if (ms == null) return "–";
  if (ms <= 0) return "0";
  if (ms < 1000) return Math.round(ms) + " ms";
  if (ms < 60000) return (ms / 1000).toFixed(1) + " s";
  if (ms < 3600000) return Math.round(ms / 60000) + " min";
  if (ms < 86400000) return (ms / 3600000).toFixed(1) + " h";
  return (ms / 86400000).toFixed(1) + " d";
}

function fmtRate(perSec) {
  if (perSec == null || isNaN(perSec)) return "–";
  if (perSec === 0) return "0";
  if (perSec >= 100) return Math.round(perSec) + "/s";
  if (perSec >= 1) return (+perSec.toFixed(1)) + "/s";
  if (perSec >= 0.1) return (+perSec.toFixed(2)) + "/s";
  if (perSec * 60 >= 1) return (+(perSec * 60).toFixed(1)) + "/min";
  return (+(perSec * 3600).toFixed(1)) + "/h";
}

function fmtNum(n) {
  if (n == null) return "–";
  if (n >= 1e6) return (n / 1e6).toFixed(1) + "M";
  if (n >= 1e4) return Math.round(n / 1e3) + "k";
  return String(Math.round(n));
}

function fmtWhen(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  const ago = Date.now() - d.getTime();
  const rel = ago >= 0 ? fmtDelay(ago) + " ago" : "in " + fmtDelay(-ago);
  return fmtClock(d.getTime()) + " (" + rel + ")";
}

// el makes an element: el("td", {className: "x"}, "text", child, ...).
function el(tag, props, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "dataset") Object.assign(e.dataset, v);
    else if (k === "on") for (const [ev, f] of Object.entries(v)) e.addEventListener(ev, f);
    else e[k] = v;
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

// rates turns a series of totals into per-second rates between samples.
function rates(t, totals) {
  const out = [];
  for (let i = 1; i < t.length; i++) {
    const dt = (t[i] - t[i - 1]) / 1000;
    out.push([t[i], dt > 0 ? Math.max(0, totals[i] - totals[i - 1]) / dt : 0]);
  }
  return out;
}

// recentRate is the rate over the last span ms of a series of totals.
function recentRate(t, totals, span = 10000) {
  const n = t.length;
  if (n < 2) return null;
  let i = n - 2;
  while (i > 0 && t[n - 1] - t[i] < span) i--;
  const dt = (t[n - 1] - t[i]) / 1000;
  return dt > 0 ? Math.max(0, totals[n - 1] - totals[i]) / dt : null;
}
