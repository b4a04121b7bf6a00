// The status page, part 4 of 4: its state, the refresh every 2 s, and the
// buttons. History comes from the server (GET /v1/history: it samples the
// busiest tenants whether or not a page is open), so a page opened during
// an incident shows the minutes before it.

const pageSize = 50;
const state = {
  who: null,                // GET /v1/whoami
  offset: 0, next: null,    // the page of GET /v1/tenants shown
  selected: decodeURIComponent((location.hash.match(/tenant=([^&]+)/) || [])[1] || ""),
  window: 5 * 60 * 1000,
  serverNow: 0,             // the server's clock at the last refresh
  oldest: 0,                // the oldest sample shown
  fallbackRate: {},         // delivered/s from two refreshes, for tenants with no history
  seen: {},                 // previous refresh: tenant -> {t, delivered}
  timer: 0,
};

async function loadWho() {
  state.who = await api("GET", "/v1/whoami");
  const w = state.who;
  $("who").textContent = w.auth ? w.role + " token “" + w.name + "”" + (w.all_tenants ? "" : " · tenants " + w.tenants.join(", ")) : "no auth (loopback)";
  $("who").dataset.role = w.role;
  $("changeToken").hidden = !w.auth;
}

// loadTenants is the page of busy tenants shown: GET /v1/tenants for a token
// that reaches all of them, else each tenant of the token's scope.
async function loadTenants() {
  const w = state.who;
  if (w.all_tenants) {
    const body = await api("GET", "/v1/tenants?offset=" + state.offset + "&limit=" + pageSize);
    if ((body.tenants || []).length === 0 && state.offset > 0) { state.offset = 0; return loadTenants(); }
    state.next = body.next_offset;
    return body.tenants || [];
  }
  const mine = await Promise.all(w.tenants.slice(0, pageSize).map((t) => api("GET", "/v1/tenants/" + encodeURIComponent(t))));
  state.next = null;
  return mine.sort((a, b) => b.queue_depth - a.queue_depth || a.tenant.localeCompare(b.tenant));
}

function noteRates(list, now) {
  const seen = {};
  state.fallbackRate = {};
  for (const t of list) {
    const p = state.seen[t.tenant];
    if (p && now > p.t) state.fallbackRate[t.tenant] = Math.max(0, t.delivered_total - p.delivered) / ((now - p.t) / 1000);
    seen[t.tenant] = { t: now, delivered: t.delivered_total };
  }
  state.seen = seen;
}

async function loadHistory(names) {
  const q = names.map((n) => "tenant=" + encodeURIComponent(n)).join("&");
  const body = await api("GET", "/v1/history?" + q);
  if (body.window_ms) state.window = body.window_ms;
  if (body.now_ms) state.serverNow = body.now_ms;

  if (body.interval_ms) chartGap = 3 * body.interval_ms;
  return body.tenants || {};
}

function oldestSample(histories) {
  let oldest = 0;
  for (const h of histories) if (h.t.length && (!oldest || h.t[0] < oldest)) oldest = h.t[0];
  return oldest;
}

async function loadDetail(hist) {
  const name = state.selected;
  if (!name) return renderDetail(null);
  let t, failed, policy;
  try {
    [t, failed, policy] = await Promise.all([
      api("GET", "/v1/tenants/" + encodeURIComponent(name)),
      api("GET", "/v1/tenants/" + encodeURIComponent(name) + "/jobs?state=failed&limit=20").then((b) => b.jobs || []),
      api("GET", "/v1/tenants/" + encodeURIComponent(name) + "/policy"),
    ]);
  } catch (e) {
    if (e instanceof ApiError) return renderDetail(null, null, null, null, name + ": " + e.message);
    throw e;
  }
  renderDetail(t, hist[name], failed, state.who, null, policy);
}

// refreshOnce reads everything shown and redraws it; it runs every 2 s,
// and at once after a button.
async function refreshOnce() {
  try {
    if (!state.who) await loadWho();
    const list = await loadTenants();
    const now = Date.now();
    noteRates(list, now);
    const names = list.map((t) => t.tenant).slice(0, 99);
    if (state.selected && !names.includes(state.selected)) names.push(state.selected);
    const [hist, ds] = await Promise.all([loadHistory(names), state.who.all_tenants ? api("GET", "/v1/downstreams") : null]);
    state.oldest = oldestSample([...Object.values(hist), ...((ds && ds.downstreams) || []).map((d) => d.history)]);
    renderDownstreams(ds);
    renderTenants(list, hist);
    renderPager(list);
    await loadDetail(hist);
    conn.lastOk = Date.now();
    setConn("live", "live · " + fmtClock(conn.lastOk));
    $("tokenForm").dataset.show = "";
  } catch (e) {
    showFailure(e);
  }
}

// refresh runs one refresh at a time: asked again meanwhile (a button), it
// runs once more as soon as the current one ends.
let running = null, again = false;
function refresh() {
  if (running) { again = true; return running; }
  clearTimeout(state.timer);
  running = refreshOnce().finally(() => {
    running = null;
    if (again) { again = false; refresh(); return; }
    state.timer = setTimeout(refresh, 2000);
  });
  return running;
}

function showFailure(e) {
  if (e instanceof Unreachable) {
    setConn("unreachable", "server unreachable");
  } else if (e instanceof ApiError && e.status === 401) {
    state.who = null;
    setConn("auth", conn.token ? "token refused" : "needs a token");
    $("tokenForm").dataset.show = "1";
    renderTenants([], {}, "this page needs an API token (any role; all tenants to see the list)");
  } else if (e instanceof ApiError && e.status === 503) {
    setConn("error", "store unavailable");
    notice(e.message, true);
  } else {
    setConn("error", "error");
    notice(String(e.message || e), true);
  }
}

function renderPager(list) {
  $("prev").disabled = state.offset === 0;
  $("next").disabled = state.next == null;
  const from = list.length ? state.offset + 1 : 0;
  $("pageInfo").textContent = list.length ? "busy tenants " + from + "–" + (state.offset + list.length) + ", deepest first" +
    (state.next != null ? " (more)" : "") : "busy tenants, deepest first";
  $("pageNote").textContent = state.next != null ? "page " + (state.offset / pageSize + 1) : "";
}

function selectTenant(name) {
  state.selected = name;
  history.replaceState(null, "", "#tenant=" + encodeURIComponent(name));
  refresh();
}

// act runs a button's request, says what happened, and refreshes.
async function act(what, method, path, ok, done) {
  try {
    const body = await api(method, path, ok);
    notice(done(body));
  } catch (e) {
    notice(what + ": " + (e instanceof Unreachable ? "server unreachable" : e.message), true);
  }
  refresh();
}

function retryJob(id) {
  act("retry " + id, "POST", "/v1/jobs/" + encodeURIComponent(id) + "/retry", [202], (b) => {
    if ($("lookupResult").dataset.job === id) lookup(id);
    return "job " + id + " sent again: " + b.state + ", expected delay " + fmtDelay(b.expected_delay_ms) + " (depth " + b.queue_depth + ")";
  });
}

function hold(tenant, pause) {
  act((pause ? "pause " : "resume ") + tenant, "POST", "/v1/tenants/" + encodeURIComponent(tenant) + (pause ? "/pause" : "/resume"), [200],
    (b) => tenant + (b.held ? " is held: nothing is sent until resumed" : " resumed: its queue goes on at its rate"));
}

async function lookup(id) {
  id = id.trim();
  if (!id) return renderLookup(null);
  try {
    renderLookup(await api("GET", "/v1/jobs/" + encodeURIComponent(id)), state.who);
  } catch (e) {
    const msg = e instanceof ApiError && e.status === 404 ? "no job " + id + " (or not one this token may see)" : e.message;
    renderLookup(null, null, msg);
  }
}

$("tokenForm").addEventListener("submit", (e) => {
  e.preventDefault();
  setToken($("tokenInput").value.trim());
  $("tokenInput").value = "";
  state.who = null;
  notice("");
  refresh();
});
$("changeToken").addEventListener("click", () => { $("tokenForm").dataset.show = "1"; $("tokenInput").focus(); });
$("lookupForm").addEventListener("submit", (e) => { e.preventDefault(); lookup($("lookupInput").value); });
$("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - pageSize); refresh(); });
$("next").addEventListener("click", () => { if (state.next != null) { state.offset = state.next; refresh(); } });
refresh();
