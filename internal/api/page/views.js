// The status page, part 3 of 4: what each section shows, from the API's
// answers. The state and the actions are in app.js.

function zip(t, v) { return t.map((x, i) => [x, v[i]]); }

// span is the charts' time axis: the last window, ending at the server's
// clock (the browser's may be off).
// It starts at the oldest sample shown (at least a minute back), so a page
// of a server that started a moment ago is not squeezed into its right
// edge.
function span() {
  const t1 = state.serverNow || Date.now();
  const oldest = state.oldest || t1;
  return [Math.max(t1 - state.window, Math.min(oldest, t1 - 60000)), t1];
}

function renderDownstreams(body) {
  const box = $("downstreams");
  const items = (body && body.downstreams) || [];
  box.replaceChildren();
  $("dsSub").textContent = body ? "this process's attempts, last " + Math.round(state.window / 60000) + " min" : "";
  if (!body) { box.append(el("div", { className: "empty" }, "needs a token for all tenants (\"*\")")); return; }
  if (items.length === 0) box.append(el("div", { className: "empty" }, "no downstream configured"));
  for (const d of items) box.append(downstreamCard(d, body.classes || Object.keys(classColors)));
}

function downstreamCard(d, classes) {
  const [t0, t1] = span();
  const h = d.history;
  const perClass = classes.map((c) => ({ name: c, color: classColors[c] || "#888", points: rates(h.t, h.attempts[c] || []) }))
    .filter((s) => s.points.some(([, v]) => v > 0));
  const total = rates(h.t, h.t.map((_, i) => classes.reduce((a, c) => a + ((h.attempts[c] || [])[i] || 0), 0)));
  const totalNow = total.length ? recentRate(h.t, h.t.map((_, i) => classes.reduce((a, c) => a + ((h.attempts[c] || [])[i] || 0), 0))) : null;
  const ceil = d.ceiling && d.ceiling.rate_per_second;
  const card = el("div", { className: "ds", dataset: { downstream: d.name } });
  const open = d.breaker_open;
  card.append(el("h3", {}, d.name, el("span", { className: "badge breaker " + (open ? "bad" : "ok"), dataset: { open: open ? "1" : "0" } },
    open ? "BREAKER OPEN: sends stopped" : "breaker closed")));
  if (ceil) {
    const use = totalNow == null ? null : totalNow / ceil;
    card.append(el("div", { className: "kv ceiling-use", dataset: { use: use == null ? "" : use.toFixed(3) } },
      "ceiling ", el("b", {}, fmtRate(ceil)), " · using ", el("b", {}, fmtRate(totalNow)),
      use == null ? "" : " (" + Math.round(use * 100) + " %)"));
    const bar = el("div", { className: "bar" }, el("div", { className: use > 0.9 ? "hot" : "" }));
    bar.firstChild.style.width = Math.min(100, Math.round((use || 0) * 100)) + "%";
    card.append(bar);
  } else {
    card.append(el("div", { className: "kv ceiling-use" }, "no ceiling · ", el("b", {}, fmtRate(totalNow)), " attempts"));
  }
  const inWindow = (series) => series.length ? Math.max(0, series[series.length - 1] - series[0]) : 0;
  card.append(el("div", { className: "kv pushbacks", dataset: { total: String(d.pushbacks_total) } },
    "pushbacks (429, 503 + Retry-After): ", el("b", {}, fmtNum(inWindow(h.pushbacks))), " in " + Math.round(state.window / 60000) + " min · ",
    fmtNum(d.pushbacks_total) + " total"));
  if (d.max_in_flight || (d.rate_limit_headers && d.rate_limit_headers !== "off")) {
    const parts = [];
    if (d.max_in_flight) parts.push("at most " + d.max_in_flight + " in flight");
    if (d.rate_limit_headers && d.rate_limit_headers !== "off") {
      parts.push("reads its " + d.rate_limit_headers + " rate limit fields (a none left holds " +
        (d.rate_limit_scope === "downstream" ? "all its tenants" : "the tenant") + "): " + fmtNum(d.announced_holds_total) + " holds until a reset");
    }
    card.append(el("div", { className: "kv announced", dataset: { holds: String(d.announced_holds_total || 0) } }, parts.join(" · ")));
  }
  const chips = el("div", { className: "classes" });
  for (const c of classes) {
    const n = inWindow(h.attempts[c] || []);
    if (n === 0 && c !== "2xx") continue;
    const chip = el("span", { dataset: { class: c, count: String(n) } }, el("i"), c + " " + fmtNum(n));
    chip.firstChild.style.background = classColors[c] || "#888";
    chips.append(chip);
  }
  card.append(chips);
  const svg = svgEl("svg", { class: "chart wide" });
  card.append(svg);
  setTimeout(() => lineChart(svg, { series: perClass.length ? perClass : [{ name: "all", color: "#1a7f37", points: total }],
    t0, t1, fmt: fmtRate, ref: ceil ? { value: ceil, label: "ceiling" } : null, minMax: 1 }));
  return card;
}

// limitText names the limit that binds a tenant's wait (limited_by).
function limitText(t) {
  return { rate: "its rate", window: "a window", ceiling: "its downstream's ceiling", in_flight: "its cap on jobs in flight (an estimate)", paused: "a pause" }[t.limited_by] || "its rate";
}

function holdText(t) {
  if (!t.paused) return "";
  if (t.held) return "held by an operator";
  return t.paused_until ? "paused until " + fmtClock(Date.parse(t.paused_until)) : "paused";
}

function renderTenants(list, hist, note) {
  const rows = $("rows");
  rows.replaceChildren();
  const [t0, t1] = span();
  if (list.length === 0) {
    rows.append(el("tr", {}, el("td", { colSpan: 7, className: "empty" }, note || "no tenant has jobs waiting")));
    return;
  }
  for (const t of list) {
    const h = hist[t.tenant];
    const perSec = h ? recentRate(h.t, h.delivered_total) : state.fallbackRate[t.tenant];
    const full = t.capacity > 0 && t.queue_depth >= t.capacity;
    const name = el("button", { className: "link", type: "button", textContent: t.tenant, title: t.tenant });
    const spark = (series, color, cls) => h ? sparkline(series, color, t0, t1, cls) : "";
    const tr = el("tr", { className: full ? "full" : "", dataset: { tenant: t.tenant, selected: t.tenant === state.selected ? "1" : "" } },
      el("td", { className: "tenant" }, name),
      el("td", { className: "depth", title: "capacity " + t.capacity, dataset: { depth: String(t.queue_depth) } },
        spark(h && zip(h.t, h.depth), full ? "#b3261e" : "#1f6feb", ""), fmtNum(t.queue_depth), scheduledNote(t)),
      el("td", { className: "delay", title: "limited by " + limitText(t), dataset: { ms: String(t.expected_delay_ms), limitedBy: t.limited_by || "" } },
        spark(h && zip(h.t, h.expected_delay_ms), "#8250df", "wide"), fmtDelay(t.expected_delay_ms)),
      el("td", { className: "rate-now", dataset: { perSec: perSec == null ? "" : perSec.toFixed(3) } },
        spark(h && rates(h.t, h.delivered_total), "#1a7f37", "wide"), fmtRate(perSec)),
      el("td", { className: "wide" }, fmtRate(t.rate_per_second)),
      el("td", { className: "state" }, holdText(t) ? el("span", { className: "badge warn" }, t.held ? "held" : "paused") : ""),
      el("td", { className: "wide failed" }, fmtNum(t.failed_total)));
    tr.addEventListener("click", () => selectTenant(t.tenant));
    rows.append(tr);
  }
}

// scheduledNote shows a tenant's jobs booked for a later not_before, when
// it has any: they wait outside its queue, counted in neither its depth
// nor its capacity.
function scheduledNote(t) {
  if (!t.scheduled) return null;
  return el("span", { className: "sched", title: "jobs booked for a later not_before, not counted in the depth (at most " + fmtNum(t.max_scheduled) + ")",
    dataset: { scheduled: String(t.scheduled) } }, " +" + fmtNum(t.scheduled) + " scheduled");
}

function renderDetail(t, h, failed, who, err, policy) {
  const box = $("detailBody");
  $("detail").dataset.tenant = t ? t.tenant : "";
  if (!t) {
    $("detailTitle").replaceChildren("Tenant ", el("span", { className: "sub" }, err || "pick one in the list"));
    box.replaceChildren();
    return;
  }
  const state1 = holdText(t);
  $("detailTitle").replaceChildren("Tenant " + t.tenant, state1 ? el("span", { className: "badge warn", id: "holdState" }, state1) : el("span", { id: "holdState", className: "badge ok" }, "sending"));
  const kids = [el("div", { className: "kv" }, t.mode + " · rate " + fmtRate(t.rate_per_second) + " · burst " + t.burst + " · capacity " + t.capacity +
    " · downstream " + t.downstream + " · in flight " + t.in_flight + (t.max_in_flight ? " of at most " + t.max_in_flight : "") +
    (t.scheduled ? " · scheduled " + fmtNum(t.scheduled) + " of at most " + fmtNum(t.max_scheduled) + " (outside the queue)" : "") +
    " · limited by " + limitText(t))];
  if (policy) kids.push(policyLine(policy));
  if (who && who.can_hold) {
    kids.push(el("div", { className: "actions" },
      el("button", { id: "pauseBtn", type: "button", className: "danger", disabled: !!t.held, textContent: "Pause", on: { click: () => hold(t.tenant, true) } }),
      el("button", { id: "resumeBtn", type: "button", className: "primary", disabled: !t.held, textContent: "Resume", on: { click: () => hold(t.tenant, false) } }),
      el("span", { className: "kv" }, t.held ? "nothing is sent until resumed; it still accepts jobs while it has room" : "an operator hold: nothing is sent until resumed")));
  }
  kids.push(el("div", { className: "kv totals" }, "accepted " + fmtNum(t.accepted_total) + " · rejected " + fmtNum(t.rejected_total) +
    " · delivered " + fmtNum(t.delivered_total) + " · failed " + fmtNum(t.failed_total) + " · expired " + fmtNum(t.expired_total)));
  kids.push(failedTable(failed, who));
  kids.push(detailCharts(t, h));
  box.replaceChildren(...kids);
}

// policyLine says where the tenant's policy comes from: its plan and each
// key not left to tenant_defaults, with its source (api, plan, file).
function policyLine(p) {
  const set = p.api ? "api" : "file";
  const parts = [p.plan ? "plan " + p.plan + " (" + ({ api: "set by the API", file: "the file's", default: "tenant_defaults'" }[p.plan_from] || p.plan_from) + ")" : "no plan"];
  const keys = [];
  for (const k of Object.keys(p.from).sort()) {
    if (p.from[k] === "default") continue;
    const v = p.policy[k];
    keys.push(el("span", { className: "key", dataset: { key: k, from: p.from[k] } }, " · " + k + " " + (Array.isArray(v) ? (v.join(", ") || "none") : v) + " (" + p.from[k] + ")"));
  }
  return el("div", { id: "policy", className: "kv", dataset: { set, plan: p.plan || "" }, title: "where each key of the policy comes from: api (throttler tenant set), plan, file ([tenants.X]); the rest is tenant_defaults'" },
    "policy: " + parts[0] + (p.api ? "; set by the API" : ""), ...keys);
}

function detailCharts(t, h) {
  const [t0, t1] = span();
  const wrap = el("div", { className: "charts" });
  const fig = (key, title, now) => {
    const svg = svgEl("svg", { class: "chart", "data-series": key });
    wrap.append(el("figure", {}, el("figcaption", {}, el("span", {}, title), el("b", {}, now)), svg));
    return svg;
  };
  const delivered = h ? rates(h.t, h.delivered_total) : [];
  const perSec = h ? recentRate(h.t, h.delivered_total) : state.fallbackRate[t.tenant];
  const depthSvg = fig("depth", "queue depth", fmtNum(t.queue_depth) + " / " + t.capacity);
  const delaySvg = fig("delay", "expected delay", fmtDelay(t.expected_delay_ms));
  const delivSvg = fig("delivered", "delivered/s", fmtRate(perSec));
  if (!h) wrap.append(el("div", { className: "kv" }, "no history kept for this tenant: only the busiest are followed"));
  setTimeout(() => {
    lineChart(depthSvg, { series: [{ name: "depth", color: "#1f6feb", points: h ? zip(h.t, h.depth) : [] }], t0, t1, fmt: fmtNum,
      ref: t.capacity > 0 ? { value: t.capacity, label: "capacity " + t.capacity } : null });
    lineChart(delaySvg, { series: [{ name: "delay", color: "#8250df", points: h ? zip(h.t, h.expected_delay_ms) : [] }], t0, t1, fmt: fmtDelay });
    lineChart(delivSvg, { series: [{ name: "delivered", color: "#1a7f37", points: delivered }], t0, t1, fmt: fmtRate,
      ref: { value: t.rate_per_second, label: "rate" } });
  });
  return wrap;
}

function failedTable(failed, who) {
  const wrap = el("div", { id: "failed" }, el("h2", {}, "Failed jobs ", el("span", { className: "sub" }, "newest first, kept for store.retention")));
  if (!failed) return wrap;
  if (failed.length === 0) { wrap.append(el("div", { className: "empty" }, "none")); return wrap; }
  const body = el("tbody");
  for (const j of failed) {
    const retry = who && who.can_retry
      ? el("button", { className: "retry", type: "button", textContent: "Retry", on: { click: (e) => { e.stopPropagation(); retryJob(j.id); } } })
      : "";
    body.append(el("tr", { dataset: { job: j.id } },
      el("td", { className: "id" }, el("button", { className: "link", type: "button", textContent: j.id.slice(0, 10) + "…", title: j.id, on: { click: () => lookup(j.id) } })),
      el("td", { className: "err" }, el("div", { className: "clamp", title: j.last_error || "" }, j.last_error || "(no error recorded)"),
        el("div", { className: "kv" }, j.attempts + " attempt" + (j.attempts === 1 ? "" : "s") + (j.finished_at ? " · failed " + fmtWhen(j.finished_at) : ""))),
      el("td", {}, retry)));
  }
  wrap.append(el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "job"), el("th", {}, "last error"), el("th", {}, ""))), body));
  return wrap;
}

function renderLookup(j, who, err) {
  const box = $("lookupResult");
  if (!j && !err) { box.replaceChildren(); return; }
  const close = el("button", { className: "link", type: "button", textContent: "close", on: { click: () => renderLookup(null) } });
  if (err) {
    box.dataset.state = "error";
    box.replaceChildren(el("h2", {}, "Job lookup ", close), el("div", { className: "empty" }, err));
    return;
  }
  box.dataset.state = j.state;
  box.dataset.job = j.id;
  const row = (k, v) => [el("dt", {}, k), el("dd", {}, v == null || v === "" ? "–" : v)];
  const tenant = el("button", { className: "link", type: "button", textContent: j.tenant, on: { click: () => selectTenant(j.tenant) } });
  const dl = el("dl", {}, ...row("id", j.id), ...row("tenant", tenant), ...row("state", el("span", { className: "badge " + (j.state === "failed" ? "bad" : j.state === "succeeded" ? "ok" : ""), id: "lookupState" }, j.state)),
    ...row("attempts", String(j.attempts)), ...row("enqueued", fmtWhen(j.enqueued_at)),
    ...(j.not_before ? row("not before", fmtWhen(j.not_before)) : []), ...row(j.state === "scheduled" ? "booked for" : "dispatch at", fmtWhen(j.dispatch_at)),
    ...row("finished", fmtWhen(j.finished_at)), ...row("request", requestView(j.request)),
    ...row("response", j.response ? responseView(j.response) : j.response_status ? String(j.response_status) : null), ...row("last error", j.last_error),
    ...row("callback", callbackView(j.callback)));
  const kids = [el("h2", {}, "Job ", close), dl];
  if (j.state === "failed" && who && who.can_retry) {
    kids.push(el("div", { className: "actions" }, el("button", { className: "retry primary", type: "button", textContent: "Retry", on: { click: () => retryJob(j.id) } })));
  }
  box.replaceChildren(...kids);
}

// callbackView shows the callback a job's end owes its producer: where,
// its state and attempts, and why the last one failed.
function callbackView(c) {
  if (!c) return null;
  const state = c.state == null ? "when it ends" : c.state + " (" + c.attempts + (c.attempts === 1 ? " attempt)" : " attempts)");
  const kids = [el("span", { className: "badge " + (c.state === "failed" ? "bad" : c.state === "delivered" ? "ok" : ""), id: "lookupCallback" }, state),
    " to ", el("code", {}, c.url)];
  if (c.on) kids.push(" on " + c.on.join(", "));
  if (c.last_error) kids.push(el("div", { className: "err" }, c.last_error));
  return el("span", {}, ...kids);
}

// headerList shows headers as "Name: value" lines.
function headerList(h, cls) {
  const names = Object.keys(h || {}).sort();
  if (names.length === 0) return null;
  return el("div", { className: "headers " + cls }, ...names.map((n) => el("div", {}, n + ": " + h[n])));
}

// requestView is what a job asked of its downstream's request (null: the
// downstream's own): method, path and query, then its headers.
function requestView(r) {
  if (!r) return null;
  const q = Object.entries(r.query || {}).flatMap(([k, vs]) => vs.map((v) => encodeURIComponent(k) + "=" + encodeURIComponent(v))).join("&");
  const line = (r.method || "(downstream's method)") + " " + (r.path || "(downstream's url)") + (q ? "?" + q : "");
  return el("div", { className: "job-request" }, el("code", { className: "line" }, line), headerList(r.headers, "request-headers"));
}

// responseView is what was kept of the downstream's latest answer: its
// status, headers and body (text, or base64 for bytes), and whether the
// body was cut.
function responseView(r) {
  const status = el("b", { className: "status", dataset: { status: String(r.status) } }, String(r.status));
  const kids = [el("div", {}, status, r.truncated ? el("span", { className: "badge warn truncated" }, "body truncated") : "")];
  const h = headerList(r.headers, "response-headers");
  if (h) kids.push(h);
  if (r.body_base64) kids.push(el("pre", { className: "body", dataset: { encoding: "base64" } }, "(not UTF-8, base64) " + r.body_base64));
  else if (r.body) kids.push(el("pre", { className: "body" }, r.body));
  return el("div", { className: "job-response" }, ...kids);
}
