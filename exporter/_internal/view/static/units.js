// ttft-exporter view: Grafana's units, colours and thresholds, for the panels (panels.js).
"use strict";
window.TtftUnits = (function () {
  const PALETTE = ["#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A9",
    "#705DA0", "#508642", "#CCA300", "#447EBC", "#C15C17", "#890F02", "#0A437C", "#6D1F62",
    "#584477", "#B7DBAB", "#F4D598", "#70DBED", "#F9BA8F"];
  const NAMED = { green: "#73BF69", red: "#F2495C", orange: "#FF9830", yellow: "#FADE2A",
    blue: "#5794F2", purple: "#B877D9", "dark-orange": "#FA6400", "dark-red": "#C4162A",
    "dark-green": "#37872D", transparent: "transparent", text: "#ccccdc" };

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

  return { PALETTE, format, color, thresholdColor };
})();
