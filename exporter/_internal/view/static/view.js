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
  const CELL = 30; // Grafana's grid: 24 columns, rows of 30 px
  const PALETTE = ["#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A9",
    "#705DA0", "#508642", "#CCA300", "#447EBC", "#C15C17", "#890F02", "#0A437C", "#6D1F62",
    "#584477", "#B7DBAB", "#F4D598", "#70DBED", "#F9BA8F"];
  const NAMED = { green: "#73BF69", red: "#F2495C", orange: "#FF9830", yellow: "#FADE2A",
    blue: "#5794F2", purple: "#B877D9", "dark-orange": "#FA6400", "dark-red": "#C4162A",
    "dark-green": "#37872D", transparent: "transparent", text: "#ccccdc" };

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

  function regexEscape(text) { return text.replace(/[\\^$*+?.()|[\]{}]/g, "\\$&"); }

  function variableText(v) {
    if (v.selected === null) {
      if (v.def.allValue) return v.def.allValue;
      return v.values.length ? `(${v.values.map(regexEscape).join("|")})` : ".*";
    }
    const picked = v.selected.map(regexEscape);
    return picked.length === 1 ? picked[0] : `(${picked.join("|")})`;
  }

  function interpolate(text, extra) {
    return text.replace(/\$\{(\w+)\}|\$(\w+)/g, (whole, braced, bare) => {
      const name = braced || bare;
      if (extra && name in extra) return extra[name];
      if (name in variables) return variableText(variables[name]);
      return whole;
    });
  }

  async function api(path, query) {
    const response = await fetch(`/api/v1/${path}?${new URLSearchParams(query)}`);
    const body = await response.json();
    if (body.status !== "success") throw new Error(`${body.errorType}: ${body.error}`);
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

  // --- units, colours, thresholds -------------------------------------------------------------

  function autoDecimals(x) {
    const a = Math.abs(x);
    if (a === 0 || a >= 100) return 0;
    if (a >= 10) return 1;
    if (a >= 1) return 2;
    return Math.min(6, 2 - Math.floor(Math.log10(a)));
  }

  function fixed(x, decimals) { return x.toFixed(decimals == null ? autoDecimals(x) : decimals); }

  function format(x, unit, decimals) {
    if (x == null || Number.isNaN(x)) return "–";
    if (!Number.isFinite(x)) return x > 0 ? "+Inf" : "-Inf";
    const a = Math.abs(x);
    switch (unit || "short") {
      case "percentunit": return `${fixed(x * 100, decimals)}%`;
      case "percent": return `${fixed(x, decimals)}%`;
      case "ms": return format(x / 1000, "s", decimals);
      case "s":
        if (a === 0) return "0 s";
        if (a < 0.001) return `${fixed(x * 1e6, decimals)} µs`;
        if (a < 1) return `${fixed(x * 1000, decimals)} ms`;
        if (a < 60) return `${fixed(x, decimals)} s`;
        if (a < 3600) return `${fixed(x / 60, decimals)} min`;
        return `${fixed(x / 3600, decimals)} hour`;
      case "reqps": return `${fixed(x, decimals)} req/s`;
      case "short":
        for (const [size, suffix] of [[1e12, " T"], [1e9, " B"], [1e6, " Mil"], [1e3, " K"]]) {
          if (a >= size) return `${fixed(x / size, decimals)}${suffix}`;
        }
        return fixed(x, decimals);
      default: return `${fixed(x, decimals)} ${unit}`; // Grafana: an unknown unit is a suffix
    }
  }

  function color(name) { return NAMED[name] || name || NAMED.green; }

  function thresholdColor(thresholds, x) {
    let picked = "green";
    for (const step of (thresholds && thresholds.steps) || []) {
      if (step.value === null || x >= step.value) picked = step.color;
    }
    return color(picked);
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

  function number(text) { return text === "+Inf" ? Infinity : text === "-Inf" ? -Infinity : Number(text); }

  async function runTargets(panel, range, scope) {
    const out = [];
    await Promise.all((panel.targets || []).filter((t) => !t.hide && t.expr).map(async (t) => {
      const query = interpolate(t.expr, scope.values);
      const data = t.instant
        ? await api("query", { query, time: range.end })
        : await api("query_range", { query, start: range.start, end: range.end, step: scope.step });
      const rows = data.resultType === "scalar" ? [{ metric: {}, value: data.result }] : data.result;
      rows.forEach((row, i) => out.push({
        ref: t.refId, order: i, labels: row.metric, name: legend(t.legendFormat, row.metric),
        points: (row.values || [row.value]).map(([at, value]) => [Number(at), number(value)]),
      }));
    }));
    return out.sort((a, b) => (a.ref < b.ref ? -1 : a.ref > b.ref ? 1 : a.order - b.order));
  }

  function lastNotNull(points) {
    for (let i = points.length - 1; i >= 0; i--) if (!Number.isNaN(points[i][1])) return points[i][1];
    return NaN;
  }

  // --- panel renderers ------------------------------------------------------------------------

  function noData(body, panel) {
    const defaults = panel.fieldConfig && panel.fieldConfig.defaults;
    body.innerHTML = "";
    const message = document.createElement("div");
    message.className = "nodata";
    message.textContent = (defaults && defaults.noValue) || "No data";
    body.appendChild(message);
    return "nodata";
  }

  function stat(body, panel, series) {
    const fc = panel.fieldConfig.defaults;
    if (!series.length) return noData(body, panel);
    body.innerHTML = "";
    body.classList.add("stats");
    for (const s of series) {
      const value = lastNotNull(s.points);
      const tile = document.createElement("div");
      tile.className = "stat";
      tile.style.background = Number.isNaN(value) ? "transparent" : thresholdColor(fc.thresholds, value);
      tile.innerHTML = `<span class="value"></span><span class="name"></span>`;
      tile.firstChild.textContent = format(value, fc.unit, fc.decimals);
      tile.lastChild.textContent = series.length > 1 ? s.name : "";
      body.appendChild(tile);
    }
    return "stat";
  }

  function bargauge(body, panel, series) {
    const fc = panel.fieldConfig.defaults;
    if (!series.length) return noData(body, panel);
    const values = series.map((s) => lastNotNull(s.points));
    const steps = ((fc.thresholds && fc.thresholds.steps) || []).map((s) => s.value).filter((v) => v != null);
    const max = fc.max != null ? fc.max : Math.max(...values.filter(Number.isFinite), ...steps, 0) || 1;
    const min = fc.min != null ? fc.min : 0;
    body.innerHTML = "";
    series.forEach((s, i) => {
      const row = document.createElement("div");
      row.className = "bar";
      row.innerHTML = `<span class="name"></span><span class="track"><span class="fill"></span></span><span class="value"></span>`;
      row.children[0].textContent = s.name;
      const share = Math.max(0, Math.min(1, (values[i] - min) / (max - min)));
      row.querySelector(".fill").style.width = `${(share * 100).toFixed(1)}%`;
      row.querySelector(".fill").style.background = thresholdColor(fc.thresholds, values[i]);
      row.children[2].textContent = format(values[i], fc.unit, fc.decimals);
      body.appendChild(row);
    });
    return "chart";
  }

  function table(body, panel, series) {
    const fc = panel.fieldConfig.defaults;
    if (!series.length) return noData(body, panel);
    const keys = [...new Set(series.flatMap((s) => Object.keys(s.labels)))].filter((k) => k !== "__name__").sort();
    const grid = document.createElement("table");
    grid.className = "data";
    grid.insertRow().innerHTML = keys.concat(["Value"]).map((k) => `<th>${k}</th>`).join("");
    for (const s of series) {
      const row = grid.insertRow();
      for (const k of keys) row.insertCell().textContent = s.labels[k] || "";
      row.insertCell().textContent = format(lastNotNull(s.points), fc.unit, fc.decimals);
    }
    body.innerHTML = "";
    body.appendChild(grid);
    return "chart";
  }

  function aligned(series) { // one x axis (the steps of the range), a column per series
    const xs = [...new Set(series.flatMap((s) => s.points.map((p) => p[0])))].sort((a, b) => a - b);
    const at = new Map(xs.map((x, i) => [x, i]));
    const columns = series.map((s) => {
      const column = new Array(xs.length).fill(null);
      for (const [x, y] of s.points) column[at.get(x)] = Number.isFinite(y) ? y : null;
      return column;
    });
    return { xs, columns };
  }

  function legendTable(series, columns, calcs, unit, decimals) {
    const wanted = (calcs && calcs.length ? calcs : []).filter((c) => c === "lastNotNull" || c === "max" || c === "min" || c === "mean");
    const names = { lastNotNull: "Last *", max: "Max", min: "Min", mean: "Mean" };
    const box = document.createElement("table");
    box.className = "legend";
    box.insertRow().innerHTML = `<th></th>${wanted.map((c) => `<th>${names[c]}</th>`).join("")}`;
    series.forEach((s, i) => {
      const present = columns[i].filter((v) => v != null);
      const value = { lastNotNull: present[present.length - 1], max: Math.max(...present),
        min: Math.min(...present), mean: present.reduce((a, b) => a + b, 0) / present.length };
      const row = box.insertRow();
      row.insertCell().innerHTML = `<i style="background:${PALETTE[i % PALETTE.length]}"></i>`;
      row.cells[0].append(s.name);
      for (const c of wanted) row.insertCell().textContent = present.length ? format(value[c], unit, decimals) : "–";
    });
    return box;
  }

  function timeseries(body, panel, series) {
    const fc = panel.fieldConfig.defaults;
    const custom = fc.custom || {};
    const drawn = series.filter((s) => s.points.some((p) => Number.isFinite(p[1])));
    if (!drawn.length) return noData(body, panel);
    const { xs, columns } = aligned(drawn);
    const stacked = custom.stacking && custom.stacking.mode === "normal";
    const plotted = stacked ? columns.map((c, i) => c.map((v, j) =>
      columns.slice(0, i + 1).reduce((sum, col) => sum + (col[j] || 0), 0))) : columns;
    const options = (panel.options && panel.options.legend) || {};
    body.innerHTML = "";
    body.classList.toggle("legend-right", options.placement === "right");
    const plot = document.createElement("div");
    plot.className = "plot";
    body.appendChild(plot);
    if (options.showLegend !== false) {
      body.appendChild(legendTable(drawn, columns, options.calcs, fc.unit, fc.decimals));
    }
    const width = Math.max(200, plot.clientWidth || body.clientWidth);
    const height = Math.max(80, (plot.clientHeight || body.clientHeight) - 4);
    const steps = ((fc.thresholds && fc.thresholds.steps) || []).filter((s) => s.value != null);
    const lines = custom.thresholdsStyle && custom.thresholdsStyle.mode === "line";
    const alpha = Math.round(((custom.fillOpacity || 0) / 100) * 255).toString(16).padStart(2, "0");
    new uPlot({ // eslint-disable-line no-new
      width, height, legend: { show: false }, cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true }, y: { distr: custom.scaleDistribution && custom.scaleDistribution.type === "log" ? 3 : 1,
        range: (u, lo, hi) => [fc.min != null ? fc.min : Math.min(0, lo), fc.max != null ? fc.max : (hi > lo ? hi : lo + 1)] } },
      axes: [{ stroke: "#aaa", grid: { stroke: "#333" } },
        { stroke: "#aaa", grid: { stroke: "#333" }, size: 84, values: (u, ticks) => ticks.map((t) => format(t, fc.unit, fc.decimals)) }],
      series: [{}].concat(drawn.map((s, i) => ({
        label: s.name, stroke: PALETTE[i % PALETTE.length], width: custom.lineWidth || 1, points: { show: false },
        fill: alpha !== "00" ? PALETTE[i % PALETTE.length] + alpha : undefined,
      }))),
      hooks: { draw: [(u) => {
        if (!lines) return;
        const ctx = u.ctx;
        for (const step of steps) {
          const y = u.valToPos(step.value, "y", true);
          if (y < u.bbox.top || y > u.bbox.top + u.bbox.height) continue;
          ctx.save();
          ctx.strokeStyle = color(step.color);
          ctx.setLineDash([6, 4]);
          ctx.beginPath();
          ctx.moveTo(u.bbox.left, y);
          ctx.lineTo(u.bbox.left + u.bbox.width, y);
          ctx.stroke();
          ctx.restore();
        }
      }] },
    }, [xs, ...plotted], plot);
    return "chart";
  }

  function heatmap(body, panel, series) {
    // format "heatmap": one series per `le`, cumulative; Grafana sorts by le and draws each
    // bucket's own count (the difference of neighbours) per step.
    const buckets = series.filter((s) => s.labels.le !== undefined)
      .sort((a, b) => number(a.labels.le) - number(b.labels.le));
    if (!buckets.length || !buckets.some((s) => s.points.some((p) => p[1] > 0))) return noData(body, panel);
    const { xs, columns } = aligned(buckets);
    const counts = columns.map((c, i) => c.map((v, j) => Math.max(0, (v || 0) - (i ? columns[i - 1][j] || 0 : 0))));
    const top = Math.max(...counts.flat(), 1);
    body.innerHTML = "";
    const canvas = document.createElement("canvas");
    const width = Math.max(200, body.clientWidth), height = Math.max(80, body.clientHeight - 4);
    canvas.width = width;
    canvas.height = height;
    body.appendChild(canvas);
    const ctx = canvas.getContext("2d");
    const left = 70, bottom = 18, w = (width - left) / xs.length, h = (height - bottom) / buckets.length;
    const exponent = (panel.options && panel.options.color && panel.options.color.exponent) || 0.5;
    counts.forEach((column, i) => column.forEach((count, j) => {
      if (!count) return;
      const strength = Math.pow(count / top, exponent);
      ctx.fillStyle = `rgba(255, ${Math.round(200 - 140 * strength)}, 40, ${0.15 + 0.85 * strength})`;
      ctx.fillRect(left + j * w, height - bottom - (i + 1) * h, Math.max(1, w - 1), Math.max(1, h - 1));
    }));
    ctx.fillStyle = "#aaa";
    ctx.font = "10px sans-serif";
    const unit = panel.options && panel.options.yAxis && panel.options.yAxis.unit;
    const every = Math.ceil(buckets.length / Math.max(1, Math.floor((height - bottom) / 14)));
    buckets.forEach((s, i) => {
      if (i % every) return;
      ctx.fillText(s.labels.le === "+Inf" ? "+Inf" : format(number(s.labels.le), unit), 2, height - bottom - i * h - 2);
    });
    for (const j of [0, Math.floor(xs.length / 2), xs.length - 1]) {
      ctx.fillText(new Date(xs[j] * 1000).toLocaleTimeString(), left + j * w - (j ? 40 : 0), height - 4);
    }
    return "chart";
  }

  const RENDERERS = { timeseries, stat, bargauge, table, heatmap, graph: timeseries };

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
      element.dataset.state = render(body, panel, await runTargets(panel, range, scope));
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
    const response = await fetch("/api/findings");
    const answer = await response.json();
    box.textContent = "";
    box.dataset.findings = String(answer.findings.length);
    const span = `last ${answer.since}s vs the ${answer.baseline}s before`;
    if (answer.error) {
      box.appendChild(text("h2", "diagnose"));
      box.appendChild(text("div", answer.error, "muted"));
      return;
    }
    box.appendChild(text("h2", answer.findings.length
      ? `diagnose: ${answer.findings.length} degraded (${span})` : `diagnose: TTFT not degraded anywhere (${span})`));
    const list = document.createElement("ul");
    for (const f of answer.findings) {
      const item = document.createElement("li");
      const link = text("a", f.cause);
      link.href = f.runbook;
      link.target = "_blank";
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
