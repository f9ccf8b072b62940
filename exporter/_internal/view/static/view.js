// ttft-exporter view: draws a generated Grafana dashboard's JSON from Prometheus' HTTP API
// (passed through by the view server), as Grafana would: the same rows, panels, queries, units,
// thresholds and template variables. Each panel ends in one state, in its data-state attribute:
// "chart", "stat", "nodata" (the panel's noValue text, or "No data") or "error".
"use strict";
(function () {
  const settings = JSON.parse(document.getElementById("settings").textContent);
  const boardElement = document.getElementById("dashboard");
  const board = boardElement ? JSON.parse(boardElement.textContent) : null;
  const params = new URLSearchParams(location.search);
  const DURATION = { ms: 0.001, s: 1, m: 60, h: 3600, d: 86400, w: 604800, y: 31536000 };
  const RENDERERS = window.TtftPanels.renderers; // panels.js
  const number = window.TtftPanels.number;

  // --- time range and Grafana's built-in variables --------------------------------------------

  function secondsAgo(text) { // "now-3h" -> 10800; "now" -> 0
    const m = /^now(?:-(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y))?$/.exec(text || "");
    return m ? (m[1] ? Number(m[1]) * DURATION[m[2]] : 0) : null;
  }

  function timeRange() {
    const from = params.get("from") || settings.time_from ||
      (board && board.time && board.time.from) || "now-1h";
    const seconds = secondsAgo(from) || 3600;
    const end = Math.floor(Date.now() / 1000);
    return { from, seconds, start: end - seconds, end };
  }

  function builtins(range, width) {
    // Grafana: $__interval = range / max data points (the panel's width), at least the scrape
    // interval; $__rate_interval = max($__interval + scrape, 4 x scrape).
    const scrape = settings.scrape_seconds;
    const step = Math.max(scrape, Math.ceil(range.seconds / Math.max(100, width)));
    return { step, values: {
      __interval: `${step}s`, __rate_interval: `${Math.max(step + scrape, 4 * scrape)}s`,
      __range: `${range.seconds}s`, __range_s: `${range.seconds}` } };
  }

  // --- template variables ---------------------------------------------------------------------

  const variables = {}; // name -> {def, values, selected (null: All)}

  function interpolate(text, extra) {
    return text.replace(/\$\{(\w+)\}|\$(\w+)/g, (whole, braced, bare) => {
      const name = braced || bare;
      if (extra && name in extra) return extra[name];
      if (name in variables) {
        const v = variables[name];
        return window.TtftPromql.variableText(v.def, v.values, v.selected); // promql.js
      }
      return whole;
    });
  }

  async function answer(url) { // the JSON a view server's URL answers; a clear error otherwise
    const response = await fetch(url);
    const text = await response.text();
    try {
      return JSON.parse(text);
    } catch (error) {
      throw new Error(`${url.split("?")[0]} answered HTTP ${response.status}, not JSON: ${text.slice(0, 200)}`);
    }
  }

  async function api(path, query) {
    const body = await answer(`/api/v1/${path}?${new URLSearchParams(query)}`);
    if (!body || body.status !== "success") {
      throw new Error(body && body.errorType ? `${body.errorType}: ${body.error}` : `/api/v1/${path}: no status in the answer`);
    }
    if (body.data === undefined || body.data === null) throw new Error(`/api/v1/${path}: no data in the answer`);
    return body.data;
  }

  async function loadVariables(range) {
    const bar = document.getElementById("variables");
    bar.textContent = "";
    for (const def of (board.templating && board.templating.list) || []) {
      if (def.type !== "query") continue; // the datasource: the one Prometheus
      const query = (typeof def.query === "string" ? def.query : def.query.query).trim();
      const m = /^label_values\((?:(.*),)?\s*(\w+)\s*\)$/.exec(query);
      if (!m) throw new Error(`variable ${def.name}: only label_values() is previewed`);
      const q = { start: range.start, end: range.end };
      if (m[1]) q["match[]"] = interpolate(m[1].trim());
      const values = (await api(`label/${m[2]}/values`, q)).slice().sort();
      const asked = params.getAll(`var-${def.name}`).filter((x) => x !== "$__all");
      const current = def.current && def.current.value;
      const isAll = !asked.length && (!current || [].concat(current).includes("$__all"));
      const v = variables[def.name] = { def, values, selected: isAll ? null : (asked.length ? asked : [].concat(current)) };
      const label = document.createElement("label");
      label.textContent = def.label || def.name;
      const select = document.createElement("select");
      select.name = def.name;
      for (const value of (def.includeAll ? ["$__all"] : []).concat(values)) {
        const option = new Option(value === "$__all" ? "All" : value, value);
        option.selected = value === "$__all" ? v.selected === null : (v.selected || []).includes(value);
        select.add(option);
      }
      select.addEventListener("change", () => {
        params.delete(`var-${def.name}`);
        if (select.value !== "$__all") params.append(`var-${def.name}`, select.value);
        history.replaceState(null, "", `${location.pathname}?${params}`);
        refresh();
      });
      label.appendChild(select);
      bar.appendChild(label);
    }
  }

  // --- query results --------------------------------------------------------------------------

  function legend(format, labels) {
    if (format && format !== "__auto") {
      return format.replace(/\{\{\s*(\w+)\s*\}\}/g, (w, name) => labels[name] || "");
    }
    const inner = Object.entries(labels).filter(([k]) => k !== "__name__")
      .map(([k, v]) => `${k}="${v}"`).join(", ");
    return `${labels.__name__ || ""}{${inner}}`;
  }

  async function runTargets(panel, range, scope) {
    const out = [];
    await Promise.all((panel.targets || []).filter((t) => !t.hide && t.expr).map(async (t) => {
      const query = interpolate(t.expr, scope.values);
      const data = t.instant
        ? await api("query", { query, time: range.end })
        : await api("query_range", { query, start: range.start, end: range.end, step: scope.step });
      const rows = data.resultType === "scalar" ? [{ metric: {}, value: data.result }] : data.result;
      if (!Array.isArray(rows)) throw new Error(`query ${t.refId}: a ${data.resultType} answer, not series`);
      rows.forEach((row, i) => out.push({
        ref: t.refId, order: i, labels: row.metric, name: legend(t.legendFormat, row.metric),
        points: (row.values || [row.value]).map(([at, value]) => [Number(at), number(value)]),
      }));
    }));
    return out.sort((a, b) => (a.ref < b.ref ? -1 : a.ref > b.ref ? 1 : a.order - b.order));
  }

  // --- the dashboard --------------------------------------------------------------------------

  function layOut() {
    const main = document.getElementById("board");
    main.textContent = "";
    const panels = [];
    for (const panel of board.panels || []) {
      const nested = panel.type === "row" ? panel.panels || [] : [];
      for (const p of [panel, ...nested]) {
        const element = document.createElement("section");
        const g = p.gridPos || { x: 0, y: 0, w: 24, h: 8 };
        element.style.gridColumn = `${g.x + 1} / span ${g.w}`;
        element.style.gridRow = `${g.y + 1} / span ${g.h}`;
        element.dataset.title = p.title || "";
        element.dataset.type = p.type;
        if (p.type === "row") {
          element.className = "row";
          element.textContent = p.title || "";
          main.appendChild(element);
          continue;
        }
        element.className = "panel";
        element.dataset.state = "loading";
        element.innerHTML = `<div class="title"><span></span></div><div class="body"></div>`;
        element.querySelector(".title span").textContent = p.title || "";
        element.querySelector(".title span").title = p.description || "";
        for (const link of p.links || []) {
          const a = document.createElement("a");
          a.href = link.url;
          a.target = "_blank";
          a.rel = "noopener";
          a.textContent = "runbook";
          a.title = link.title || link.url;
          element.querySelector(".title").appendChild(a);
        }
        main.appendChild(element);
        panels.push([p, element]);
      }
    }
    return panels;
  }

  async function drawPanel(panel, element, range) {
    const body = element.querySelector(".body");
    const render = RENDERERS[panel.type];
    try {
      if (!render) throw new Error(`panel type ${panel.type} is not previewed`);
      const scope = builtins(range, body.clientWidth || 600);
      element.dataset.state = render(body, panel, await runTargets(panel, range, scope), range);
    } catch (error) {
      element.dataset.state = "error";
      body.innerHTML = "";
      const message = document.createElement("div");
      message.className = "error";
      message.textContent = String(error.message || error);
      body.appendChild(message);
    }
  }

  // --- alerts and findings (every page) -------------------------------------------------------

  function text(tag, content, className) {
    const element = document.createElement(tag);
    element.textContent = content;
    if (className) element.className = className;
    return element;
  }

  async function drawAlerts() {
    const box = document.getElementById("alerts");
    try {
      const alerts = (await api("alerts", {})).alerts;
      const firing = alerts.filter((a) => a.state === "firing");
      box.textContent = "";
      box.dataset.firing = String(firing.length);
      box.appendChild(text("h2", `${firing.length} alert${firing.length === 1 ? "" : "s"} firing` +
        (alerts.length > firing.length ? ` (${alerts.length - firing.length} pending)` : "")));
      const list = document.createElement("ul");
      for (const a of firing) {
        const where = ["model", "route", "tenant", "sli", "cause"].filter((k) => a.labels[k]).map((k) => a.labels[k]).join(" / ");
        const item = document.createElement("li");
        item.append(text("span", a.labels.severity || "", `severity ${a.labels.severity || ""}`),
          text("b", a.labels.alertname), ` ${where}`);
        if (a.annotations && a.annotations.summary) item.append(text("div", a.annotations.summary, "muted"));
        list.appendChild(item);
      }
      box.appendChild(list);
    } catch (error) {
      box.textContent = `alerts: ${error.message || error}`;
    }
  }

  async function drawFindings() {
    const box = document.getElementById("findings");
    let found;
    try {
      found = await answer("/api/findings");
      if (!Array.isArray(found.findings)) throw new Error("/api/findings: no findings in the answer");
    } catch (error) {
      box.textContent = `diagnose: ${error.message || error}`;
      return;
    }
    drawFound(box, found);
  }

  function drawFound(box, found) {
    box.textContent = "";
    box.dataset.findings = String(found.findings.length);
    const span = `last ${found.since}s vs the ${found.baseline}s before`;
    if (found.error) {
      box.appendChild(text("h2", "diagnose"));
      box.appendChild(text("div", found.error, "muted"));
      return;
    }
    box.appendChild(text("h2", found.findings.length
      ? `diagnose: ${found.findings.length} degraded (${span})` : `diagnose: TTFT not degraded anywhere (${span})`));
    const list = document.createElement("ul");
    for (const f of found.findings) {
      const item = document.createElement("li");
      const link = text("a", f.cause);
      link.href = f.runbook;
      link.target = "_blank";
      link.rel = "noopener";
      item.append(text("b", `${f.model} / ${f.route}: `), link,
        ` (${f.tenants && f.tenants.length ? f.tenants.join(", ") : "all tenants"})`);
      list.appendChild(item);
    }
    box.appendChild(list);
  }

  // --- refresh loop ---------------------------------------------------------------------------

  let panels = null;
  let running = null;

  async function drawAll() {
    try {
      await drawEverything();
    } catch (error) { // e.g. a variable's query failed: said on the page, not only the console
      const main = document.getElementById("board") || document.body;
      main.prepend(text("div", `cannot draw the dashboard: ${error.message || error}`, "error"));
    }
    document.body.dataset.rendered = String(Number(document.body.dataset.rendered || 0) + 1);
  }

  async function drawEverything() {
    const range = timeRange();
    document.getElementById("range").textContent = `${range.from} to now · every ${refreshSeconds()} s`;
    const jobs = [drawAlerts(), drawFindings()];
    if (board) {
      if (!panels) {
        await loadVariables(range);
        panels = layOut();
      }
      jobs.push(...panels.map(([panel, element]) => drawPanel(panel, element, range)));
    }
    await Promise.all(jobs);
  }

  function refresh() {
    panels = null;
    running = (running || Promise.resolve()).then(drawAll);
  }

  function refreshSeconds() {
    return secondsAgo(`now-${params.get("refresh") || ""}`) || settings.refresh_seconds;
  }

  running = drawAll();
  setInterval(() => { running = running.then(drawAll); }, refreshSeconds() * 1000);
})();
