// The status page: poll /v1/tenants each second, update the table, and draw
// the last five minutes of queue depth (top tenants) on a canvas.
"use strict";
(function () {
  const keepMs = 5 * 60 * 1000;
  const history = []; // {t, depth: {tenant: n}}
  let last = null;    // previous poll: {t, delivered: {tenant: n}}
  let token = sessionStorage.getItem("throttlerToken") || "";
  const colors = ["#1f6feb", "#d1242f", "#1a7f37", "#9a6700", "#8250df", "#bf3989"];

  document.getElementById("token").addEventListener("submit", (e) => {
    e.preventDefault();
    token = document.getElementById("tokenInput").value.trim();
    sessionStorage.setItem("throttlerToken", token);
    poll();
  });

  function fmtDelay(ms) {
    if (ms <= 0) return "0";
    if (ms < 1000) return ms + "ms";
    if (ms < 60000) return (ms / 1000).toFixed(1) + "s";
    if (ms < 3600000) return Math.round(ms / 1000) + "s";
    return (ms / 3600000).toFixed(1) + "h";
  }
  function fmtRate(perSec) {
    if (perSec >= 1) return (+perSec.toFixed(2)) + "/s";
    if (perSec * 60 >= 1) return (+(perSec * 60).toFixed(2)) + "/m";
    return (+(perSec * 3600).toFixed(2)) + "/h";
  }
  function cell(text, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (cls) td.className = cls;
    return td;
  }

  async function poll() {
    const headers = token ? { Authorization: "Bearer " + token } : {};
    let resp;
    try {
      resp = await fetch("/v1/tenants?limit=1000", { headers });
    } catch (e) {
      document.getElementById("error").textContent = "cannot reach the API";
      return;
    }
    if (resp.status === 401 || resp.status === 403) {
      document.getElementById("token").style.display = "block";
      document.getElementById("error").textContent = "this page needs a viewer token with scope *";
      return;
    }
    const body = await resp.json();
    document.getElementById("error").textContent = "";
    const now = Date.now();
    const tenants = body.tenants || [];
    const rows = document.getElementById("rows");
    rows.replaceChildren();
    if (tenants.length === 0) {
      const tr = document.createElement("tr");
      const td = cell("no tenant has jobs waiting");
      td.colSpan = 12;
      tr.appendChild(td);
      rows.appendChild(tr);
    }
    const delivered = {};
    const depth = {};
    for (const t of tenants) {
      delivered[t.tenant] = t.delivered_total;
      depth[t.tenant] = t.queue_depth;
      let perSec = "-";
      if (last && last.delivered[t.tenant] !== undefined) {
        perSec = ((t.delivered_total - last.delivered[t.tenant]) / ((now - last.t) / 1000)).toFixed(1);
      }
      const tr = document.createElement("tr");
      tr.dataset.tenant = t.tenant;
      if (t.capacity > 0 && t.queue_depth >= t.capacity) tr.className = "full";
      tr.append(cell(t.tenant), cell(t.queue_depth, "depth"), cell(t.capacity), cell(fmtDelay(t.expected_delay_ms)),
        cell(perSec, "rate-now"), cell(fmtRate(t.rate_per_second)), cell(t.in_flight),
        cell(t.paused ? (t.paused_until || "held") : "-"), cell(t.accepted_total), cell(t.rejected_total),
        cell(t.delivered_total), cell(t.failed_total));
      rows.appendChild(tr);
    }
    last = { t: now, delivered };
    history.push({ t: now, depth });
    while (history.length && history[0].t < now - keepMs) history.shift();
    document.getElementById("updated").textContent = "updated " + new Date(now).toLocaleTimeString();
    draw(tenants.slice(0, colors.length).map((t) => t.tenant));
  }

  function draw(top) {
    const c = document.getElementById("chart");
    const g = c.getContext("2d");
    const w = c.width, h = c.height, pad = 30;
    g.clearRect(0, 0, w, h);
    let max = 1;
    for (const p of history) for (const k of top) max = Math.max(max, p.depth[k] || 0);
    g.strokeStyle = "#e3e6ea";
    g.fillStyle = "#667";
    g.font = "12px system-ui";
    for (let i = 0; i <= 4; i++) {
      const y = pad + ((h - 2 * pad) * i) / 4;
      g.beginPath(); g.moveTo(pad, y); g.lineTo(w - 10, y); g.stroke();
      g.fillText(String(Math.round(max - (max * i) / 4)), 2, y + 4);
    }
    const t0 = Date.now() - keepMs;
    top.forEach((k, i) => {
      g.strokeStyle = colors[i];
      g.lineWidth = 2;
      g.beginPath();
      history.forEach((p, j) => {
        const x = pad + ((w - pad - 10) * (p.t - t0)) / keepMs;
        const y = h - pad - ((h - 2 * pad) * (p.depth[k] || 0)) / max;
        if (j === 0) g.moveTo(x, y); else g.lineTo(x, y);
      });
      g.stroke();
      g.fillStyle = colors[i];
      g.fillText(k, w - 160, pad + 14 * i);
    });
    g.fillStyle = "#667";
    g.fillText("queue depth, last 5 minutes", pad, h - 8);
    c.dataset.points = String(history.length);
    c.dataset.max = String(max);
  }

  poll();
  setInterval(poll, 1000);
})();
