"""The Helm chart renders with a real Helm engine, lints clean, validates offline against the
Kubernetes 1.30 schemas, and carries exactly the committed alerts/ and dashboards/ (with the
release's job in the rules). The Prometheus Operator resources exist only where the cluster
has their CRDs: renders pass the API versions a cluster would have (Helm's --api-versions)."""

from __future__ import annotations

import importlib
import json
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter._internal.config.loader import load
from exporter._internal.diagnose.run import DiagnoseError, parse_duration
from exporter._internal.diagnose.watch import Windows
from exporter._internal import names
from exporter._internal.generate.files import CAUSE_FILE, RULE_FILES, generate
from exporter._internal.fleet.access import open_push_problem
from exporter.cli import build_parser
from tests.support import require_module
from tests.support.prometheus import PrometheusServer, require_prometheus, scrape_config

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "ttft-exporter"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
KUBE_VERSION = "1.30.0"
CORE_KINDS = {"ConfigMap", "Secret", "Service", "ServiceAccount", "Deployment",
              "PersistentVolumeClaim"}
CRD_KINDS = {"ServiceMonitor", "PrometheusRule"}
#: What `--api-versions` (or a cluster with the Prometheus Operator) gives Helm.
OPERATOR_APIS = ["monitoring.coreos.com/v1", "monitoring.coreos.com/v1/ServiceMonitor",
                 "monitoring.coreos.com/v1/PrometheusRule"]
#: The Prometheus the watch queries in the tests' values (the ci/ scenarios name their own).
PROMETHEUS_URL = "http://prometheus-operated.monitoring.svc:9090"
#: The config file both Deployments mount and pass with --config.
CONFIG_PATH = "/etc/ttft-exporter/ttft-exporter.yaml"


@pytest.fixture(scope="module")
def helm():
    return require_module("helm_python")


@pytest.fixture(scope="module")
def chart(helm):
    return helm.Chart.load(str(CHART))


def render_raw(chart, values: dict, name: str = "llm", namespace: str = "obs",
               api_versions: list[str] | None = None) -> dict[str, str]:
    """Template path -> text, rendered by Helm with these extra API versions available.

    helm-python-sdk's `Chart.render` has no `api_versions` argument; its native render takes
    the option (Helm's --api-versions), so it is called directly."""
    if not api_versions:
        return chart.render(values, name=name, namespace=namespace)
    native = importlib.import_module("helm_python._native")
    options = {"name": name, "namespace": namespace, "api_versions": api_versions}
    return json.loads(native.call_string("helm_render", chart._raw(), json.dumps(values),
                                         json.dumps(options)))


def render(chart, values: dict, name: str = "llm", namespace: str = "obs",
           api_versions: list[str] | None = OPERATOR_APIS) -> list[dict]:
    out = render_raw(chart, values, name, namespace, api_versions)
    docs = []
    for template, text in sorted(out.items()):
        if template.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                doc["_template"] = template
                docs.append(doc)
    return docs


def values_of(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def with_prometheus(values: dict) -> dict:
    """The values with the watch on, querying PROMETHEUS_URL (the watch is off by default; on,
    the chart refuses it without a URL: where Prometheus is cannot be guessed)."""
    return _merged({"watch": {"enabled": True, "prometheusUrl": PROMETHEUS_URL}}, values)


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def of_template(docs: list[dict], kind: str, template: str) -> dict:
    """The one document of this kind that templates/<template> renders."""
    doc, = [d for d in by_kind(docs, kind) if d["_template"].endswith(f"/templates/{template}")]
    return doc


def test_chart_copies_equal_the_committed_alerts_and_dashboards():
    sys.path.insert(0, str(ROOT / "helm"))
    try:
        sync = importlib.import_module("sync_files")
    finally:
        sys.path.pop(0)
    assert sync.pairs(), "no alerts/ or dashboards/ found"
    assert sync.stale() == [], "chart copies are stale: run `python helm/sync_files.py`"


def test_there_are_ci_scenarios():
    assert {p.name for p in CI_VALUES} >= {"default-values.yaml", "full-values.yaml",
                                           "minimal-values.yaml"}


def test_lint_is_clean(helm):
    for values in [{}, with_prometheus({})] + [values_of(p) for p in CI_VALUES]:
        report = helm.lint(str(CHART), values, strict=True, kube_version=f"v{KUBE_VERSION}")
        assert report["errors"] == [] and report["messages"] == [], report


@pytest.mark.parametrize("values_file", [None, *CI_VALUES],
                         ids=lambda p: p.name if p else "no-values")
def test_every_scenario_renders_and_validates_offline(chart, values_file):
    """Every ci/ scenario, and the chart with no values at all (`helm install llm chart`)."""
    kv = require_module("kubernetes_validate")
    docs = render(chart, values_of(values_file) if values_file else {})
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ConfigMap"} <= kinds
    assert kinds <= CORE_KINDS | CRD_KINDS, kinds
    for doc in docs:
        manifest = {k: v for k, v in doc.items() if k != "_template"}
        if doc["kind"] in CORE_KINDS:
            kv.validate(manifest, KUBE_VERSION, strict=True)
        else:
            check_crd(manifest)
        assert manifest["metadata"]["name"] and len(manifest["metadata"]["name"]) <= 63
    # the exporter config the chart writes is valid for `ttft-exporter serve`
    config_map = next(d for d in by_kind(docs, "ConfigMap")
                      if "ttft-exporter.yaml" in d.get("data", {}))
    config = load(yaml.safe_load(config_map["data"]["ttft-exporter.yaml"]))
    assert config.server.addr == "0.0.0.0"
    assert config.aggregator.snapshot_path.startswith("/var/lib/ttft-exporter/")
    # serve starts with it: beyond loopback, /push has a token or is open on purpose
    assert open_push_problem(config, config.server.addr) is None


def check_crd(doc: dict) -> None:
    """The Prometheus Operator CRDs have no schema offline: check the fields we rely on."""
    assert doc["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    if doc["kind"] == "ServiceMonitor":
        spec = doc["spec"]
        assert spec["selector"]["matchLabels"]
        for endpoint in spec["endpoints"]:
            # the aggregator's port, and the watch's
            assert endpoint["port"] in ("http", "http-watch") and endpoint["path"] == "/metrics"
            assert endpoint["scheme"] in ("http", "https")
    else:
        for group in doc["spec"]["groups"]:
            assert group["name"] and group["rules"]
            for rule in group["rules"]:
                assert ("alert" in rule) != ("record" in rule) and rule["expr"]


#: `histograms` value -> directory of the committed rules and dashboards it installs.
MODES = {"classic": "", "native": "native/"}


@pytest.mark.parametrize("mode", MODES)
def test_prometheus_rules_carry_exactly_the_committed_alerts_with_the_release_job(chart, mode):
    values = with_prometheus({"histograms": mode})
    docs = render(chart, values)
    rules = {d["metadata"]["annotations"]["ttft-exporter/source"]: d
             for d in by_kind(docs, "PrometheusRule")}
    sources = sorted((ROOT / "alerts" / MODES[mode]).glob("*.yaml"))
    assert sorted(rules) == [f"alerts/{MODES[mode]}{p.name}" for p in sources]
    raw = render_raw(chart, values, api_versions=OPERATOR_APIS)[
        "ttft-exporter/templates/prometheusrule.yaml"]
    for path in sources:
        text = path.read_text().replace('job=~"ttft-exporter"', 'job=~"llm-ttft-exporter"')
        if path.name == CAUSE_FILE:  # the cause alert selects only the watch's series
            assert f"expr: {names.LIKELY_CAUSE}{{" in text
        else:
            assert 'job=~"ttft-exporter"' in path.read_text()
        assert rules[f"alerts/{MODES[mode]}{path.name}"]["spec"] == yaml.safe_load(text)
        # verbatim, indented under spec: Helm did not touch {{ $labels... }} or anything else
        assert "\n".join("  " + line if line else line
                         for line in text.rstrip("\n").split("\n")) in raw
    assert "{{ $labels.model }}" in raw


def scrape_job(docs: list[dict]) -> str:
    """The `job` Prometheus gives the exporter's target: the ServiceMonitor's jobLabel read on
    the Service it selects (the Prometheus Operator's rule)."""
    monitor, = by_kind(docs, "ServiceMonitor")
    service, = [s for s in by_kind(docs, "Service") if all(
        s["spec"]["selector"].get(k) == v for k, v in
        monitor["spec"]["selector"]["matchLabels"].items())]
    return service["metadata"]["labels"][monitor["spec"]["jobLabel"]]


@pytest.mark.parametrize("values_file", CI_VALUES, ids=lambda p: p.name)
def test_every_rule_selects_the_job_the_service_monitor_gives(chart, values_file):
    values = values_of(values_file)
    values = {**values, "serviceMonitor": {**values.get("serviceMonitor", {}),
                                           "enabled": True},
              "prometheusRule": {**values.get("prometheusRule", {}), "enabled": True}}
    for name in ("llm", "ttft-exporter"):
        docs = render(chart, values, name=name)
        job = scrape_job(docs)
        matchers = [m for d in by_kind(docs, "PrometheusRule") for g in d["spec"]["groups"]
                    for r in g["rules"] for m in re.findall(r'job=~"([^"]*)"', r["expr"])]
        assert matchers, values_file.name
        assert all(re.fullmatch(m, job) for m in matchers), (job, set(matchers))
        config = yaml.safe_load(next(d for d in by_kind(docs, "ConfigMap") if
                                     "ttft-exporter.yaml" in d.get("data", {}))
                                ["data"]["ttft-exporter.yaml"])
        assert config["alerting"]["exporter_job"] == job
    assert job == values["serviceMonitor"].get("job") or job.endswith("ttft-exporter")


def test_operator_resources_need_their_crds(chart):
    values = with_prometheus({"serviceMonitor": {"enabled": True},
                              "prometheusRule": {"enabled": True}})
    without = render(chart, values, api_versions=None)
    assert not by_kind(without, "ServiceMonitor") and not by_kind(without, "PrometheusRule")
    assert {"Deployment", "Service"} <= {d["kind"] for d in without}
    notes = chart.render(values, name="llm", namespace="obs")["ttft-exporter/templates/NOTES.txt"]
    assert "no ServiceMonitor was created" in notes and "No PrometheusRule was created" in notes
    monitor_only = render(chart, values, api_versions=OPERATOR_APIS[:2])
    assert by_kind(monitor_only, "ServiceMonitor") and not by_kind(monitor_only, "PrometheusRule")
    both = render(chart, values)
    # one per rule file: recording, alerting and likely-cause rules
    assert by_kind(both, "ServiceMonitor") and len(by_kind(both, "PrometheusRule")) == len(
        RULE_FILES) == 3


def test_notes_give_commands_that_work(chart):
    notes = render_raw(chart, with_prometheus({"serviceMonitor": {"enabled": True}}),
                       api_versions=OPERATOR_APIS)["ttft-exporter/templates/NOTES.txt"]
    assert "kubectl -n obs port-forward svc/llm-ttft-exporter 9469:9469" in notes
    assert "curl -s http://127.0.0.1:9469/healthz" in notes
    assert "image ttft-exporter:0.1.0" in notes and 'job "llm-ttft-exporter"' in notes
    assert "pip install ttft-exporter" not in notes
    assert "set serviceMonitor.labels.release" in notes and "pushToken.existingSecret" in notes
    quiet = render_raw(chart, with_prometheus({
        "serviceMonitor": {"enabled": True, "labels": {"release": "kps"}},
        "pushToken": {"existingSecret": "push-token"}}),
        api_versions=OPERATOR_APIS)["ttft-exporter/templates/NOTES.txt"]
    assert "release label" not in quiet and "GitOps" not in quiet


def test_the_generated_push_token_changes_without_a_cluster_and_existing_secret_is_stable(chart):
    """What the README's GitOps advice rests on: rendered without a cluster (as Argo CD and
    Flux do), the chart's own token differs on every render; an existing Secret is referenced."""
    def tokens(values: dict) -> list[str]:
        return [d["data"]["token"] for d in by_kind(render(chart, with_prometheus(values)),
                                                    "Secret")]
    assert tokens({}) != tokens({})
    docs = render(chart, with_prometheus({"pushToken": {"existingSecret": "push-token"}}))
    assert by_kind(docs, "Secret") == [] and "push-token" in json.dumps(
        of_template(docs, "Deployment", "deployment.yaml"))


@pytest.mark.parametrize("config, refused", [
    ({"slos": [{"ttft": {"threshold_seconds": 1.0, "target": 0.99}}]}, "config.slos"),
    ({"labels": {"max_tenants": 50}}, "config.labels.max_tenants"),
    ({"labels": {"tenant_policy": "allowlist", "tenant_allowlist": ["a"]}},
     "config.labels.tenant_policy"),
    ({"alerting": {"page_severity": "page"}}, "config.alerting"),
    ({"window": {"seconds": 120}}, "config.window.seconds"),
])
def test_values_that_would_drift_from_the_generated_files_are_refused(helm, chart, config,
                                                                      refused):
    with pytest.raises(helm.HelmRenderError, match=re.escape(refused)):
        chart.render(with_prometheus({"config": config}), name="llm", namespace="obs")
    # Without rules and dashboards nothing can drift.
    chart.render(with_prometheus({"config": config, "prometheusRule": {"enabled": False},
                                  "dashboards": {"enabled": False}}), name="llm", namespace="obs")
    # What the generated files do not depend on is free.
    chart.render(with_prometheus({"config": {"labels": {"tenant_policy": "hash", "hash_salt": "x"},
                                             "alerting": {"exporter_job": "set-by-the-chart"}}}),
                 name="llm", namespace="obs")


def test_a_chart_generated_for_another_config_accepts_that_config(helm, tmp_path):
    """`ttft-exporter generate --config` at the repository's top rewrites the chart's files/:
    that chart renders the same config, with its SLOs in the rules."""
    source = {"slos": [{"ttft": {"threshold_seconds": 1.5, "target": 0.995}}],
              "labels": {"max_tenants": 50}}
    shutil.copytree(CHART, tmp_path / "helm" / "ttft-exporter")
    generate(load(source), tmp_path, source)
    other = helm.Chart.load(str(tmp_path / "helm" / "ttft-exporter"))
    docs = render(other, with_prometheus({"config": source}))
    exprs = "\n".join(r["expr"] for d in by_kind(docs, "PrometheusRule")
                      for g in d["spec"]["groups"] for r in g["rules"])
    assert 'le="1.5"' in exprs and "/ 0.005" in exprs
    with pytest.raises(helm.HelmRenderError, match="config.slos"):
        other.render(with_prometheus({}), name="llm", namespace="obs")


@pytest.mark.parametrize("mode", MODES)
def test_dashboard_configmaps_carry_exactly_the_committed_dashboards(chart, mode):
    docs = render(chart, with_prometheus({"histograms": mode}))
    maps = [d for d in by_kind(docs, "ConfigMap")
            if d["metadata"]["labels"].get("grafana_dashboard") == "1"]
    sources = sorted((ROOT / "dashboards" / MODES[mode]).glob("*.json"))
    assert len(maps) == len(sources)  # one ConfigMap per dashboard
    found = {}
    for m in maps:
        (key, text), = m["data"].items()
        found[key] = text
    for path in sources:
        assert found[path.name] + "\n" == path.read_text()
        assert json.loads(found[path.name]) == json.loads(path.read_text())
    assert any("{{" in text for text in found.values())  # legend formats survived


def test_pod_is_non_root_read_only_with_probes_and_resources(chart):
    for values_file in CI_VALUES:
        docs = render(chart, values_of(values_file))
        deployment = of_template(docs, "Deployment", "deployment.yaml")
        spec = deployment["spec"]
        assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"
        pod = spec["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        container, = pod["containers"]
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert container["resources"]["requests"] and container["resources"]["limits"]
        for probe in ("livenessProbe", "readinessProbe"):
            assert container[probe]["httpGet"]["path"] == "/healthz"
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert {"/var/lib/ttft-exporter", "/tmp"} <= mounts  # the only writable places


def test_full_scenario_wires_token_tls_auth_and_persistence(chart):
    docs = render(chart, values_of(CHART / "ci" / "full-values.yaml"))
    config = yaml.safe_load(next(d for d in by_kind(docs, "ConfigMap") if "ttft-exporter.yaml"
                                 in d.get("data", {}))["data"]["ttft-exporter.yaml"])
    agg = config["aggregator"]
    assert agg["push_token_file"] == "/var/run/secrets/ttft-exporter/push/push"
    assert agg["tls_cert_file"].endswith("tls.crt") and agg["metrics_username"] == "prometheus"
    assert agg["gauge_ttl_seconds"] == 30  # the user's aggregator settings are kept
    assert config["labels"]["tenant_policy"] == "hash"
    assert config["alerting"]["exporter_job"] == "llm-aggregator"
    deployment = of_template(docs, "Deployment", "deployment.yaml")
    pod = deployment["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["push-token"]["secret"]["secretName"] == "llm-push-token"
    assert volumes["state"]["persistentVolumeClaim"]["claimName"] == "llm-ttft-exporter"
    assert volumes["tls"]["secret"]["secretName"] == "ttft-exporter-tls"
    container = pod["containers"][0]
    assert container["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    # no Secret for the push token: the existing one is used
    assert not [s for s in by_kind(docs, "Secret") if "push" in s["metadata"]["name"]]
    monitor, = by_kind(docs, "ServiceMonitor")
    endpoints = {e["port"]: e for e in monitor["spec"]["endpoints"]}
    endpoint = endpoints.pop("http")  # the aggregator's; the watch's is plain HTTP, no auth
    assert list(endpoints) == ["http-watch"] and endpoints["http-watch"]["scheme"] == "http"
    assert not {"tlsConfig", "authorization", "basicAuth"} & set(endpoints["http-watch"])
    assert endpoint["scheme"] == "https" and endpoint["authorization"]["type"] == "Bearer"
    assert endpoint["basicAuth"]["password"]["name"] == "ttft-scrape-password"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["jobLabel"] == "ttft-exporter.io/job"
    dashboards = [d for d in by_kind(docs, "ConfigMap") if "grafana_dashboard" in
                  d["metadata"]["labels"]]
    assert {d["metadata"]["namespace"] for d in dashboards} == {"monitoring"}


def test_the_chart_installs_with_no_values_at_all(helm, chart):
    """`helm install llm helm/ttft-exporter`, nothing set, on a cluster with or without the
    Prometheus Operator: it renders (and lints clean, test_lint_is_clean) with the push token
    on and the watch off, and the NOTES say how to turn the watch on."""
    for api_versions in (None, OPERATOR_APIS):
        docs = render(chart, {}, api_versions=api_versions)
        assert not [d for d in docs if "watch" in d["_template"]]
        secret, = by_kind(docs, "Secret")
        assert secret["metadata"]["name"] == "llm-ttft-exporter-push-token"
        config = yaml.safe_load(of_template(docs, "ConfigMap", "configmap.yaml")["data"][
            Path(CONFIG_PATH).name])
        assert config["aggregator"]["push_token_file"].startswith("/var/run/secrets/")
    notes = render_raw(chart, {})["ttft-exporter/templates/NOTES.txt"]
    assert "--set watch.enabled=true --set watch.prometheusUrl=" in notes
    assert "TTFT_EXPORTER_PUSH_TOKEN=<key \"token\" of Secret llm-ttft-exporter-push-token>" in \
        notes


def test_workers_with_the_charts_token_push_to_serve_run_with_the_charts_config(
        chart, tmp_path, monkeypatch):
    """The chart with no values, run: `serve` with the ConfigMap's config (its token file
    holding the Secret's token, as the pod mounts it; on loopback here), and workers given the
    same Secret's key as TTFT_EXPORTER_PUSH_TOKEN, as the NOTES say: their pushes are counted;
    a worker without it is refused and counted as such."""
    import base64

    from exporter._internal.config.settings import Config
    from exporter._internal.fleet import push
    from exporter._internal.record.recorder import Recorder
    from exporter._internal.record.timeline import CallTimeline

    docs = render(chart, {})
    secret, = by_kind(docs, "Secret")
    token = base64.b64decode(secret["data"]["token"]).decode()
    config = yaml.safe_load(of_template(docs, "ConfigMap", "configmap.yaml")["data"][
        Path(CONFIG_PATH).name])
    token_file = tmp_path / "token"
    token_file.write_text(token)
    config["aggregator"]["push_token_file"] = str(token_file)
    config["aggregator"]["snapshot_path"] = str(tmp_path / "state")
    config_file = tmp_path / "ttft-exporter.yaml"
    config_file.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in __import__("os").environ.items() if k != push.ENV_TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "exporter.cli", "serve", "--config",
                             str(config_file), "--addr", "127.0.0.1", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        base = re.search(r"(http://\S+)/metrics", line).group(1)

        def worker_push(with_token: str | None) -> bool:
            if with_token is None:
                monkeypatch.delenv(push.ENV_TOKEN, raising=False)
            else:
                monkeypatch.setenv(push.ENV_TOKEN, with_token)
            rec = Recorder()
            flusher = push.Flusher(base, Config(), rec)
            t = CallTimeline(start=0, model="m", provider="p", route="r", tenant="t")
            t.token(1_000_000)
            t.end, t.outcome = 2_000_000, names.OK
            rec.record_call(t)
            try:
                return flusher.flush()
            finally:
                flusher.close(timeout=0)

        assert worker_push(token) and worker_push(token)
        assert not worker_push(None)
        body = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        assert re.search(r'^llm_client_requests_total\{[^}]*\} 2\.0$', body, re.M), body[:2000]
        assert re.search(f'^{names.SELF_PUSH_REJECTED}{{reason="unauthorized"}} [1-9]', body,
                         re.M)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        proc.kill()
        proc.wait()


def test_default_push_token_secret_is_made_and_mounted(chart):
    docs = render(chart, with_prometheus({}))
    secret, = [s for s in by_kind(docs, "Secret") if s["metadata"]["name"].endswith(
        "push-token")]
    import base64

    assert len(base64.b64decode(secret["data"]["token"])) >= 32
    given = render(chart, with_prometheus({"pushToken": {"value": "abc"}}))
    secret, = by_kind(given, "Secret")
    assert base64.b64decode(secret["data"]["token"]) == b"abc"


def test_minimal_scenario_has_no_rules_dashboards_or_token(chart):
    docs = render(chart, values_of(CHART / "ci" / "minimal-values.yaml"))
    assert not by_kind(docs, "PrometheusRule") and not by_kind(docs, "Secret")
    assert [d for d in by_kind(docs, "ConfigMap")] == [d for d in by_kind(docs, "ConfigMap")
                                                       if "ttft-exporter.yaml" in d["data"]]
    config = yaml.safe_load(by_kind(docs, "ConfigMap")[0]["data"]["ttft-exporter.yaml"])
    assert "push_token_file" not in config["aggregator"]
    assert config["aggregator"]["allow_unauthenticated_push"] is True  # said, not assumed


def test_bad_values_are_refused_before_anything_renders(helm, chart):
    for bad in ({"config": {"labelz": {}}}, {"port": "9469"}, {"replicaCount": 2},
                {"pushToken": {"enabled": "yes"}}, {"serviceMonitor": {"interval": "soon"}},
                {"histograms": "sparse"}):
        with pytest.raises(helm.HelmValuesError):
            chart.render(with_prometheus(bad), name="llm", namespace="obs")
    for bad in ({"tls": {"enabled": True}},
                {"metricsAuth": {"basicAuth": {"username": "prom"}}}):
        with pytest.raises(helm.HelmRenderError):
            chart.render(with_prometheus(bad), name="llm", namespace="obs")


def test_the_schema_knows_every_config_section_the_exporter_does(chart):
    """The chart README's advice, `config.dashboards.histograms: native`, renders."""
    from dataclasses import fields

    from exporter._internal.config.settings import Config

    schema = json.loads((CHART / "values.schema.json").read_text())
    # `watch` (the chart's watch Deployment) is a chart value beside `config`, not a section of
    # the exporter's config: only `config`'s sections are the exporter's.
    assert "watch" in schema["properties"]
    assert set(schema["properties"]["config"]["properties"]) == {f.name for f in fields(Config)}
    docs = render(chart, with_prometheus({"config": {"dashboards": {"histograms": "native"},
                                                     "otel": {"traces": False}}}))
    config = yaml.safe_load(by_kind(docs, "ConfigMap")[0]["data"]["ttft-exporter.yaml"])
    assert config["dashboards"] == {"histograms": "native"}
    assert load(config).dashboards.histograms == "native"


#: Strings each pattern bound takes and refuses (the numbers' samples come from the bounds).
PATTERN_SAMPLES: dict[str, tuple[list[str], list[str]]] = {
    "alerting.runbook_url": (["https://wiki.example.com/llm"], ["wiki/llm"]),
    "alerting.group_by[]": (["namespace"], ["1job", "a-b"]),
    "alerting.selector": (['namespace="prod"'], ['{namespace="prod"}']),
    "alerting.dashboard_refresh": (["1m"], ["1x", "0s", "30s\n"]),
    "push_url": (["https://aggregator:9469", ""], ["aggregator:9469"]),
    "aggregator.metrics_username": (["prom"], ["a:b"]),
}


SLO_OBJECTIVES = ("ttft", "first_answer_token", "stall")
#: What a key's sample comes with, so that only the key's own bound decides (the relations
#: between keys are the loader's: an SLO threshold within max_seconds, basic auth's two keys).
COMPANIONS: dict[str, Any] = {
    "histograms.max_seconds": lambda value: {"slos": [{objective: {"threshold_seconds": 0.5}
                                                       for objective in SLO_OBJECTIVES}]},
    "aggregator.metrics_username": lambda value: {
        "aggregator": {"metrics_password_file": "/run/secrets/password"}} if value else {},
}


def _merged(one: dict, other: dict) -> dict:
    return {**one, **{k: _merged(one[k], v) if isinstance(one.get(k), dict) else v
                      for k, v in other.items()}}


def _samples(key) -> list[Any]:
    """Values at and around a key's bound, and of the wrong type."""
    wrong_type = {"integer": [1.5, "1", True], "number": ["1", True], "string": [1, True],
                  "boolean": ["yes", 1], "array": ["x", {"a": 1}], "null": [1.0, "x"]}
    default = list(key.default) if isinstance(key.default, tuple) else key.default
    out: list[Any] = [default, *wrong_type[key.type]]
    for bound, wrap in ((key.bound, lambda v: v), (key.item_bound, lambda v: [v])):
        if bound is None:
            continue
        out += [wrap(v) for v in (*bound.choices, "nope")] if bound.choices else []
        if bound.pattern:
            good, bad = PATTERN_SAMPLES[key.path + ("[]" if bound is key.item_bound else "")]
            out += [wrap(v) for v in good + bad]
        if bound.min_length:
            out += [[] if key.type == "array" else "", wrap("x" if key.type == "string" else 1)]
        step = 1 if (key.item_type if bound is key.item_bound else key.type) == "integer" \
            else 0.25
        for edge in (bound.minimum, bound.maximum, bound.above, bound.below):
            if edge is not None:
                out += [wrap(edge - step), wrap(edge), wrap(edge + step)]
    return out


def _nested(path: str, value: Any) -> dict:
    """{"a": {"b": value}} for "a.b"; an SLO key as the first (only) entry of `slos`."""
    parts = path.split(".")
    for part in reversed(parts):
        value = [value] if part.endswith("[]") else {part: value}
        if part.endswith("[]"):
            value = {part[:-2]: value}
    return value


def test_the_chart_accepts_exactly_the_values_check_config_accepts(helm, chart):
    """Every key, at and around its bound and with a wrong type, plus unknown keys: the
    chart's values schema and the exporter's loader agree on each, through a real Helm engine.
    (Checks between two keys are the loader's alone; docs/reference/config.md lists them.)"""
    from exporter._internal.config.schema import keys
    from exporter._internal.config.settings import ConfigError

    cases = [{"nope": 1}, {"server": {"nope": 1}}, {"slos": [{"nope": 1}]},
             {"slos": [{"ttft": {"nope": 1}}]}, {"slos": []}, {"server": 1}]
    for key in keys():
        companion = COMPANIONS.get(key.path, lambda value: {})
        cases += [_merged(_nested(key.path, value), companion(value)) for value in _samples(key)]
    checked, disagree = 0, []
    for config in cases:
        try:
            load(config)
            loader_accepts = True
        except ConfigError:
            loader_accepts = False
        try:
            chart.render(with_prometheus({"config": config, "prometheusRule": {"enabled": False},
                                          "dashboards": {"enabled": False}}),
                         name="llm", namespace="obs")
            chart_accepts = True
        except helm.HelmValuesError:
            chart_accepts = False
        except helm.HelmRenderError:  # past the schema: the templates refused something else
            chart_accepts = True
        checked += 1
        if loader_accepts != chart_accepts:
            disagree.append((config, loader_accepts, chart_accepts))
    assert checked > 300 and not disagree


# --- the watch (`ttft-exporter watch`): the likely cause, served to the alert ---

#: The scenarios with the watch on (minimal-values.yaml turns it off).
WATCHED = [CHART / "ci" / "default-values.yaml", CHART / "ci" / "full-values.yaml"]


def watch_values(values: dict) -> dict:
    """The watch's values as the chart sees them: values.yaml's under the given ones."""
    return {**values_of(CHART / "values.yaml")["watch"], **values.get("watch", {})}


@pytest.mark.parametrize("values_file", WATCHED, ids=lambda p: p.name)
def test_the_watch_runs_with_the_aggregators_image_config_and_hardening(chart, values_file):
    values = values_of(values_file)
    watch = watch_values(values)
    docs = render(chart, values)
    aggregator = of_template(docs, "Deployment", "deployment.yaml")
    deployment = of_template(docs, "Deployment", "watch-deployment.yaml")
    assert deployment["metadata"]["name"] == "llm-ttft-exporter-watch"
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "Recreate"
    pod, agg_pod = spec["template"]["spec"], aggregator["spec"]["template"]["spec"]
    (container,), (agg_container,) = pod["containers"], agg_pod["containers"]
    assert container["command"] == agg_container["command"] == ["ttft-exporter"]
    assert container["args"] == ["watch", "--prometheus", watch["prometheusUrl"],
                                 "--config", CONFIG_PATH, "--addr", "0.0.0.0",
                                 "--port", str(watch["port"]), "--interval", watch["interval"]]
    assert container["image"] == agg_container["image"]
    # the command line the real CLI parses, and the config it loads, queries the exporter's job
    args = build_parser().parse_args(container["args"])
    assert args.func.__name__ == "_watch" and args.port == watch["port"]
    assert (args.prometheus, args.config, args.addr) == (watch["prometheusUrl"], CONFIG_PATH,
                                                         "0.0.0.0")
    assert parse_duration(args.interval) >= 1
    config_map = of_template(docs, "ConfigMap", "configmap.yaml")
    config = load(yaml.safe_load(config_map["data"][Path(CONFIG_PATH).name]))
    assert f'job=~"{config.alerting.exporter_job}"' in Windows.of(config.alerting).matchers
    assert config.alerting.exporter_job == scrape_job(render(chart, {
        **values, "serviceMonitor": {**values.get("serviceMonitor", {}), "enabled": True}}))
    # the aggregator's config: its ConfigMap, mounted read-only where --config reads it
    assert agg_container["args"] == ["serve", "--config", CONFIG_PATH]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert set(mounts) == {str(Path(CONFIG_PATH).parent), "/tmp"}  # nothing else to write
    config_mount = mounts[str(Path(CONFIG_PATH).parent)]
    volume, = [v for v in pod["volumes"] if v["name"] == config_mount["name"]]
    assert config_mount["readOnly"] is True
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    template = spec["template"]["metadata"]
    assert template["annotations"]["checksum/config"] == aggregator["spec"]["template"][
        "metadata"]["annotations"]["checksum/config"]  # a config change restarts it too
    # the aggregator's hardening
    assert pod["securityContext"] == agg_pod["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == agg_pod["serviceAccountName"]
    security = container["securityContext"]
    assert security == agg_container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    # probes on /healthz of the port it serves, plain HTTP whatever the aggregator's scheme
    port, = container["ports"]
    assert port["containerPort"] == watch["port"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": port["name"],
                                               "scheme": "HTTP"}
        assert {k: v for k, v in container[probe].items() if k != "httpGet"} == values_of(
            CHART / "values.yaml")[probe]
    assert container["resources"] == watch["resources"]
    assert container["resources"]["requests"] and container["resources"]["limits"]
    assert watch["podAnnotations"].items() <= template["annotations"].items()
    # its pods are its own: its Service takes them, the aggregator's Deployment and Service not
    service = of_template(docs, "Service", "watch-service.yaml")
    agg_service = of_template(docs, "Service", "service.yaml")
    assert spec["selector"]["matchLabels"].items() <= template["labels"].items()
    assert service["spec"]["selector"].items() <= template["labels"].items()
    assert not aggregator["spec"]["selector"]["matchLabels"].items() <= template[
        "labels"].items()
    assert not agg_service["spec"]["selector"].items() <= template["labels"].items()
    assert not service["spec"]["selector"].items() <= aggregator["spec"]["template"][
        "metadata"]["labels"].items()
    service_port, = service["spec"]["ports"]
    assert service_port["port"] == watch["port"] and service_port["targetPort"] == port["name"]


def test_full_scenario_sets_every_watch_value():
    full = values_of(CHART / "ci" / "full-values.yaml")["watch"]
    defaults = values_of(CHART / "values.yaml")["watch"]
    assert set(full) == set(defaults) and full["enabled"] is True
    assert all(full[key] != defaults[key] for key in defaults if key != "enabled")


def test_no_watch_when_disabled(chart):
    values = values_of(CHART / "ci" / "minimal-values.yaml")
    assert values["watch"] == {"enabled": False}  # and so no Prometheus URL is needed
    values = {**values, "serviceMonitor": {"enabled": True}}
    docs = render(chart, values)
    assert not [d for d in docs if "watch" in d["_template"] or "watch" in d["metadata"]["name"]]
    monitor, = by_kind(docs, "ServiceMonitor")
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["http"]
    notes = render_raw(chart, values, api_versions=OPERATOR_APIS)[
        "ttft-exporter/templates/NOTES.txt"]
    assert "-watch" not in notes and "and the watch" not in notes
    assert "The watch is off: the LLMTTFTLikelyCause alert" in notes  # and how to turn it on


@pytest.mark.parametrize("watch, refused", [
    ({"enabled": True}, "/watch/prometheusUrl"),  # values.yaml has none
    ({"enabled": True, "prometheusUrl": ""}, "/watch/prometheusUrl"),
    ({"enabled": True, "prometheusUrl": None}, "prometheusUrl"),  # null removes the key
    ({"prometheusUrl": "prometheus-operated:9090"}, "/watch/prometheusUrl"),
    ({"prometheusUrl": "ftp://prometheus-operated:9090"}, "/watch/prometheusUrl"),
    ({"prometheusUrl": "http://"}, "/watch/prometheusUrl"),
    ({"prometheusUrl": "http://prometheus-operated:9090/?x=1"}, "/watch/prometheusUrl"),
    ({"prometheusUrl": PROMETHEUS_URL + " "}, "/watch/prometheusUrl"),
    ({"enabled": False, "prometheusUrl": "prometheus-operated:9090"}, "/watch/prometheusUrl"),
    ({"prometheusUrl": PROMETHEUS_URL, "interval": "soon"}, "/watch/interval"),
    ({"prometheusUrl": PROMETHEUS_URL, "port": 0}, "/watch/port"),
    ({"prometheusUrl": PROMETHEUS_URL, "port": "9471"}, "/watch/port"),
    ({"prometheusUrl": PROMETHEUS_URL, "replicas": 2}, "/watch"),
    ({"prometheusUrl": PROMETHEUS_URL, "enabled": "yes"}, "/watch/enabled"),
])
def test_the_schema_refuses_a_watch_that_cannot_run(helm, chart, watch, refused):
    with pytest.raises(helm.HelmValuesError, match=re.escape(refused)):
        chart.render({"watch": watch}, name="llm", namespace="obs")


def test_the_schema_takes_a_disabled_watch_without_url_and_any_http_base_url(helm, chart):
    chart.render({"watch": {"enabled": False}}, name="llm", namespace="obs")
    chart.render({"watch": {"prometheusUrl": ""}}, name="llm", namespace="obs")  # (off)
    for url in ("http://prometheus-operated:9090", "https://prometheus.example.com/prometheus",
                "http://10.0.0.7:9090/"):
        docs = render(chart, {"watch": {"enabled": True, "prometheusUrl": url}})
        container, = of_template(docs, "Deployment", "watch-deployment.yaml")["spec"][
            "template"]["spec"]["containers"]
        assert container["args"][2] == url
    # `helm lint` (and `helm install`) of a watch turned on without its URL name the value
    report = helm.lint(str(CHART), {"watch": {"enabled": True}}, strict=True,
                       kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] and all("/watch/prometheusUrl" in e for e in report["errors"])


def test_every_interval_the_schema_takes_is_a_duration_the_watch_parses(helm, chart):
    """The schema's durations are a subset of what `ttft-exporter watch --interval` parses:
    the chart never starts a watch that refuses its interval."""
    taken = []
    for interval in ("30s", "1m", "90s", "1h30m", "2d", "1w", "0s", "500ms", "1.5m", "30",
                     "m", "30s ", "", "-1m", "1m0s"):
        try:
            chart.render(with_prometheus({"watch": {"interval": interval}}), name="llm",
                         namespace="obs")
        except helm.HelmValuesError:
            continue
        taken.append(interval)
        assert parse_duration(interval) >= 1
    assert taken == ["30s", "1m", "90s", "1h30m", "2d", "1w"]
    with pytest.raises(DiagnoseError):
        parse_duration("0s")


@pytest.mark.parametrize("values_file", WATCHED, ids=lambda p: p.name)
def test_the_service_monitor_scrapes_the_watch_in_the_exporters_job(chart, values_file):
    """By the Prometheus Operator's rules: a ServiceMonitor takes the Services whose labels
    match its selector, each endpoint the ports of that name, the job from the jobLabel."""
    values = values_of(values_file)
    values = {**values, "serviceMonitor": {**values.get("serviceMonitor", {}), "enabled": True}}
    docs = render(chart, values)
    monitor, = by_kind(docs, "ServiceMonitor")
    spec = monitor["spec"]
    selected = [s for s in by_kind(docs, "Service")
                if spec["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
                and s["metadata"]["namespace"] in spec["namespaceSelector"]["matchNames"]]
    watch_service = of_template(docs, "Service", "watch-service.yaml")
    agg_service = of_template(docs, "Service", "service.yaml")
    assert selected == [agg_service, watch_service]

    def scraped(service: dict) -> list[dict]:
        ports = {p["name"] for p in service["spec"]["ports"]}
        return [e for e in spec["endpoints"] if e["port"] in ports]

    endpoint, = scraped(watch_service)  # once, plain HTTP, no credentials
    assert endpoint["path"] == "/metrics" and endpoint["scheme"] == "http"
    assert not {"tlsConfig", "authorization", "basicAuth"} & set(endpoint)
    assert len(scraped(agg_service)) == 1 and scraped(agg_service) != [endpoint]
    # the watch's series get the aggregator's job: the cause alert finds them with or without
    # the job matcher the other rules have, and the exporter-down alerts cover the watch
    job = watch_service["metadata"]["labels"][spec["jobLabel"]]
    assert job == scrape_job(docs)
    rules = [r for d in by_kind(docs, "PrometheusRule") for g in d["spec"]["groups"]
             for r in g["rules"]]
    cause = [r for r in rules if r.get("alert") == "LLMTTFTLikelyCause"]
    assert cause and all(names.LIKELY_CAUSE in r["expr"] for r in cause)
    for rule in cause:
        assert all(re.fullmatch(m, job) for m in re.findall(r'job=~"([^"]*)"', rule["expr"]))
    down, = [r for r in rules if r.get("alert") == "TTFTExporterDown"]
    assert re.fullmatch(re.match(r'up\{job=~"([^"]*)"', down["expr"]).group(1), job)
    config = yaml.safe_load(of_template(docs, "ConfigMap", "configmap.yaml")["data"][
        Path(CONFIG_PATH).name])
    assert config["alerting"]["exporter_job"] == job  # what the watch queries for


def test_notes_show_the_watch_and_both_services_to_scrape(chart):
    values = values_of(CHART / "ci" / "default-values.yaml")
    notes = render_raw(chart, values)["ttft-exporter/templates/NOTES.txt"]
    assert f"queries {values['watch']['prometheusUrl']} every 30s" in notes
    assert "kubectl -n obs port-forward svc/llm-ttft-exporter-watch 9471:9471" in notes
    assert "curl -s http://127.0.0.1:9471/metrics" in notes
    assert ('add a scrape job named "llm-ttft-exporter" for Services llm-ttft-exporter and '
            'llm-ttft-exporter-watch') in notes


def test_the_chart_readme_documents_every_watch_value():
    readme = (CHART / "README.md").read_text(encoding="utf-8")
    missing = [key for key in values_of(CHART / "values.yaml")["watch"]
               if f"`watch.{key}`" not in readme]
    assert not missing


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_charts_watch_command_line_runs_and_is_scraped_in_the_exporters_job(chart,
                                                                                 tmp_path):
    """The rendered container, run: its args as they are (the ConfigMap's file at a local
    path), probed on /healthz, querying a real Prometheus that scrapes it in the job the
    ServiceMonitor gives. (This Prometheus holds no exporter series, so the decision counts an
    error; the decision itself is diagnose's tests'.)"""
    require_prometheus()
    port = _free_port()
    values = values_of(CHART / "ci" / "default-values.yaml")
    values = {**values, "serviceMonitor": {"enabled": True},
              "watch": {**values["watch"], "port": port}}
    job = scrape_job(render(chart, values))
    with PrometheusServer(scrape_config(f"127.0.0.1:{port}", job=job)) as prom:
        docs = render(chart, {**values, "watch": {**values["watch"], "prometheusUrl": prom.url}})
        container, = of_template(docs, "Deployment", "watch-deployment.yaml")["spec"][
            "template"]["spec"]["containers"]
        config = tmp_path / Path(CONFIG_PATH).name
        config.write_text(of_template(docs, "ConfigMap", "configmap.yaml")["data"][config.name])
        args = [str(config) if arg == CONFIG_PATH else arg for arg in container["args"]]
        assert args != container["args"] and args[2] == prom.url
        proc = subprocess.Popen([sys.executable, "-m", "exporter.cli", *args],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            probe = container["readinessProbe"]["httpGet"]["path"]
            deadline = time.monotonic() + 20
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{probe}") as answer:
                        assert answer.read() == b"ok\n"
                        break
                except OSError:
                    assert proc.poll() is None, proc.stderr.read()
                    assert time.monotonic() < deadline, f"nothing answers on {probe}"
                    time.sleep(0.1)
            prom.wait_for(f'up{{job="{job}"}} == 1', timeout=30)
            prom.wait_for(f'sum({names.WATCH_EVALUATIONS}{{job="{job}"}}) > 0', timeout=30)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
            assert "Traceback" not in proc.stderr.read()
        finally:
            proc.kill()
            proc.wait()
