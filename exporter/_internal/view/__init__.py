"""`ttft-exporter view`: the generated dashboards as a local web page, drawn from Prometheus.

A faithful preview for people without Grafana at hand and for reviewing dashboard changes: the
page reads the dashboards' JSON as `generate` wrote it (rows, panels, queries, units,
thresholds, variables), asks Prometheus' HTTP API through the view server, and draws with
uPlot; the firing alerts and `diagnose`'s findings head every page.
"""
