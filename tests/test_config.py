import subprocess
import sys

import pytest

from exporter._internal import config
from exporter._internal.config import Config, ConfigError


def test_defaults_need_no_file():
    c = config.load(None)
    assert c == Config()
    assert set(c.slo_thresholds()) <= set(c.seconds_buckets())


def test_slo_thresholds_become_bucket_boundaries():
    c = config.load({"slos": [{"ttft": {"threshold_seconds": 1.75, "target": 0.95}},
                              {"model": "m", "route": "r", "stall": {"threshold_seconds": 3.3}}]})
    assert 1.75 in c.seconds_buckets() and 3.3 in c.seconds_buckets()
    override = config.slo_for(c, "m", "r")
    assert override.stall.threshold_seconds == 3.3
    assert override.ttft.threshold_seconds == 1.75  # inherited from the default entry
    assert config.slo_for(c, "m", "other") is c.slos[0]


def test_every_error_has_a_key_path_and_reason():
    with pytest.raises(ConfigError) as info:
        config.load({"labels": {"max_tenants": "many", "nope": 1, "tenant_policy": "x"},
                     "slos": [{"ttft": {"target": 1.5}}], "bogus": {}})
    paths = [path for path, _ in info.value.errors]
    assert paths == ["labels.max_tenants", "labels.nope", "bogus"]
    assert "expected int" in info.value.errors[0][1]


def test_cross_field_errors_are_all_reported():
    with pytest.raises(ConfigError) as info:
        config.load({"labels": {"tenant_policy": "x"}, "slos": [{"ttft": {"target": 1.5}}],
                     "histograms": {"seconds_buckets": [2, 1]}})
    paths = [path for path, _ in info.value.errors]
    assert paths == ["labels.tenant_policy", "histograms.seconds_buckets", "slos[0].ttft.target"]


def test_yaml_file_and_syntax_errors(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("labels:\n  max_tenants: 5\nwindow:\n  seconds: 30\n")
    assert config.load(good).labels.max_tenants == 5
    bad = tmp_path / "bad.yaml"
    bad.write_text("labels: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        config.load(bad)
    assert "line 2" in info.value.errors[0][0] and str(bad) in str(info.value)
    with pytest.raises(ConfigError):
        config.load(tmp_path / "missing.yaml")


def test_check_config_cli(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("labels:\n  max_tenants: 0\n")
    run = subprocess.run([sys.executable, "-m", "exporter.cli", "check-config", str(bad)],
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert f"{bad}: labels.max_tenants: must be at least 1" in run.stderr
    assert "Traceback" not in run.stderr
    good = tmp_path / "good.yaml"
    good.write_text("labels:\n  max_tenants: 3\n")
    run = subprocess.run([sys.executable, "-m", "exporter.cli", "check-config", str(good)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
