// Drives the status page in headless Chromium, for cmd/throttler's page
// tests: the test's proxy serves it after the page's own script, with
// `const PLAN = {steps: [...]}` before it. Each step does what an operator
// does (types a token, clicks a row, a button) and waits for the page to
// show the result; "report" steps tell the test (POST /__step), which
// checks the effect through the API before answering. The log goes into
// <pre id="driver">, which the test reads from --dump-dom.
"use strict";
(function () {
  const out = document.createElement("pre");
  out.id = "driver";
  out.hidden = true;
  document.body.append(out);
  const log = (m) => { out.textContent += m + "\n"; };
  const q = (s) => document.querySelector(s);
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

  async function until(what, cond, ms = 15000) {
    const end = Date.now() + ms;
    for (;;) {
      let v = null;
      try { v = cond(); } catch (e) { v = null; }
      if (v) return v;
      if (Date.now() > end) throw new Error("timed out waiting for " + what);
      await sleep(100);
    }
  }

  async function report(name, data) {
    const r = await fetch("/__step?name=" + encodeURIComponent(name), { method: "POST", body: JSON.stringify(data || {}) });
    const text = await r.text();
    if (text !== "ok") throw new Error("the test says, after " + name + ": " + text);
  }

  function type(sel, value) {
    const input = q(sel);
    input.value = value;
    input.dispatchEvent(new Event("input", { bubbles: true }));
  }

  const steps = {
    async token(s) {
      if (q("#tokenForm").dataset.show !== "1") q("#changeToken").click();
      type("#tokenInput", s.value);
      q("#tokenForm button").click();
      await until("role " + s.role, () => q("#who").dataset.role === s.role && q("#conn").dataset.state === "live");
    },
    async live() { await until("live", () => q("#conn").dataset.state === "live"); },
    async select(s) {
      const row = await until("row " + s.tenant, () => q('tr[data-tenant="' + s.tenant + '"] button'));
      row.click();
      await until("detail of " + s.tenant, () => q("#detail").dataset.tenant === s.tenant && q("#failed"));
    },
    async absent(s) {
      await sleep(s.after || 0);
      if (q(s.sel)) throw new Error(s.sel + " is shown, and should not be");
    },
    async present(s) { await until(s.sel, () => q(s.sel)); },
    async lookup(s) {
      type("#lookupInput", s.job);
      q("#lookupForm button").click();
      await until("job " + s.job + " looked up", () => q("#lookupResult").dataset.job === s.job);
      const text = q("#lookupResult").textContent;
      if (s.expect && !text.includes(s.expect)) throw new Error("lookup shows " + JSON.stringify(text) + ", not " + s.expect);
    },
    async retry(s) {
      const btn = await until("retry button of " + s.job, () => q('#failed tr[data-job="' + s.job + '"] button.retry'));
      btn.click();
      await until("retry notice", () => q("#notice").textContent.includes("sent again"));
      await until("job gone from the failed list", () => !q('#failed tr[data-job="' + s.job + '"]'));
      await report("retried", { job: s.job });
    },
    async pause(s) {
      (await until("Pause button", () => q("#pauseBtn:not([disabled])"))).click();
      await until("held shown", () => q("#holdState").textContent.includes("held"));
      await until("held in the list", () => q('tr[data-tenant="' + s.tenant + '"] td.state').textContent === "held");
      await report("paused", { tenant: s.tenant });
    },
    async resume(s) {
      (await until("Resume button", () => q("#resumeBtn:not([disabled])"))).click();
      await until("sending shown", () => q("#holdState").textContent.includes("sending"));
      await report("resumed", { tenant: s.tenant });
    },
    async page(s) {
      const before = q("#rows tr[data-tenant]").dataset.tenant;
      q(s.dir === "next" ? "#next" : "#prev").click();
      await until("another page", () => q("#pageInfo").textContent.includes(s.expect) && q("#rows tr[data-tenant]").dataset.tenant !== before);
    },
    async report(s) { await report(s.name, {}); },
    async rows(s) {
      const rows = [...document.querySelectorAll("#rows tr[data-tenant]")]
        .map((tr) => ({ tenant: tr.dataset.tenant, depth: +tr.querySelector("td.depth").dataset.depth }));
      await report(s.name, { rows });
    },
    async unreachable() {
      await until("unreachable shown", () => q("#conn").dataset.state === "unreachable" && q("#banner").dataset.show === "1", 20000);
      log("banner: " + q("#banner").textContent);
    },
    async wait(s) { await sleep(s.ms); },
  };

  (async () => {
    try {
      for (const s of PLAN.steps) {
        await steps[s.do](s);
        log("ok " + s.do + (s.tenant ? " " + s.tenant : "") + (s.job ? " " + s.job : ""));
      }
      log("done");
    } catch (e) {
      log("FAIL " + e.message);
    }
  })();
})();
