// ttft-exporter view: one renderer per Grafana panel type. Each draws a panel's query results
// into its body and returns the state the panel ends in: "chart", "stat" or "nodata".
"use strict";
window.TtftPanels = (function () {
  const { PALETTE, format, color, thresholdColor } = window.TtftUnits;

  function number(text) { return text === "+Inf" ? Infinity : text === "-Inf" ? -Infinity : Number(text); }

  function lastNotNull(points) {
    for (let i = points.length - 1; i >= 0; i--) if (!Number.isNaN(points[i][1])) return points[i][1];
    return NaN;
  }

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
    const head = grid.insertRow();
    for (const k of keys.concat(["Value"])) head.appendChild(document.createElement("th")).textContent = k;
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
    const head = box.insertRow();
    for (const c of ["", ...wanted]) head.appendChild(document.createElement("th")).textContent = c && names[c];
    series.forEach((s, i) => {
      const present = columns[i].filter((v) => v != null);
      const value = { lastNotNull: present[present.length - 1], max: Math.max(...present),
        min: Math.min(...present), mean: present.reduce((a, b) => a + b, 0) / present.length };
      const row = box.insertRow();
      const swatch = row.insertCell().appendChild(document.createElement("i"));
      swatch.style.background = PALETTE[i % PALETTE.length]; // a property: the policy forbids style attributes
      row.cells[0].append(s.name);
      for (const c of wanted) row.insertCell().textContent = present.length ? format(value[c], unit, decimals) : "–";
    });
    return box;
  }

  function timeseries(body, panel, series, range) {
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
      scales: { x: { time: true, range: () => [range.start, range.end] }, y: { distr: custom.scaleDistribution && custom.scaleDistribution.type === "log" ? 3 : 1,
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

  return { renderers: { timeseries, stat, bargauge, table, heatmap, graph: timeseries }, number };
})();
