// ttft-exporter view: a template variable's value written into a query as Grafana's Prometheus
// data source writes it. The dashboards put variables inside double-quoted PromQL strings
// (`model=~"$model"`); a value is escaped for the regular expression of that matcher (when the
// variable is multi-value or has "All", as Grafana does), then for the string, so any label
// value, `gpt-4.1` or one holding `"`, `\` or `|`, selects exactly its own series.
"use strict";
window.TtftPromql = (function () {
  /** RE2's metacharacters, each escaped to match itself. */
  function regexEscape(text) { return text.replace(/[\\^$.|?*+()[\]{}]/g, "\\$&"); }

  /** The inside of a PromQL double-quoted string: backslash, quote and newline escaped. */
  function stringEscape(text) {
    return text.replace(/[\\"\n]/g, (c) => (c === "\n" ? "\\n" : `\\${c}`));
  }

  /** The text a variable stands for: `def` its dashboard definition, `values` the values its
   * query found, `selected` the chosen ones (null: All). Grafana's custom "All" value is a
   * regular expression the dashboard wrote: it goes in as written. */
  function variableText(def, values, selected) {
    if (selected === null && def.allValue) return def.allValue;
    const regex = Boolean(def.multi || def.includeAll);
    const picked = (selected === null ? values : selected).map(regex ? regexEscape : (v) => v);
    if (!picked.length) return ".*";
    return stringEscape(picked.length === 1 ? picked[0] : `(${picked.join("|")})`);
  }

  return { regexEscape, stringEscape, variableText };
})();
