"""Stage 5 of the data path, what on-call sees: the Grafana dashboards and the Prometheus rules,
generated from one config so that a threshold is written once.

`files` writes dashboards/, alerts/ and the chart's copies; `alerts` and `cause_rules` are the
recording and alerting rules; `dashboards`, `agent_dashboard` and `cause_panels` the dashboards,
built on `panels` and on grafanalib extended to the current model (`grafana`). The PromQL they
share is `promql`, one level down, which the diagnosis reads too.
"""
