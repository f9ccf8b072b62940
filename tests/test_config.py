"""Config loading: defaults, SLO thresholds as buckets, and every mistake reported at once,
each at a key the user wrote, with the file and line, never a traceback whatever the bytes."""

import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from exporter._internal import promql
from exporter._internal.config import loader as config_loader, settings as config
from exporter._internal.config.settings import Config, ConfigError

CLI = [sys.executable, "-m", "exporter.cli"]


def errors_of(source) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as info:
        config_loader.load(source)
    return info.value.errors


def paths_of(source) -> list[str]:
    return [path for path, _ in errors_of(source)]


def test_defaults_need_no_file():
    c = config_loader.load(None)
    assert c == Config()
    assert set(c.slo_thresholds()) <= set(c.seconds_buckets())


def test_slo_thresholds_become_bucket_boundaries():
    c = config_loader.load({"slos": [{"ttft": {"threshold_seconds": 1.75, "target": 0.95}},
                                     {"model": "m", "route": "r",
                                      "stall": {"threshold_seconds": 3.3}}]})
    assert 1.75 in c.seconds_buckets() and 3.3 in c.seconds_buckets()
    override = config.slo_for(c, "m", "r")
    assert override.stall.threshold_seconds == 3.3
    assert override.ttft.threshold_seconds == 1.75  # inherited from the default entry
    assert config.slo_for(c, "m", "other") is c.slos[0]


def test_every_error_is_reported_in_one_pass_with_its_key_path():
    errors = errors_of({"labels": {"max_tenants": "many", "nope": 1, "tenant_policy": "x"},
                        "slos": [{"ttft": {"target": 1.5}}], "bogus": {},
                        "histograms": {"seconds_buckets": [2, 1]}})
    assert [path for path, _ in errors] == [
        "labels.max_tenants", "labels.nope", "bogus",  # types and unknown keys ...
        "labels.tenant_policy", "histograms.seconds_buckets", "slos[0].ttft.target"]  # ... and
    assert "expected int" in errors[0][1]  # cross-field mistakes, together


def test_an_override_is_blamed_only_for_what_it_says():
    # the default entry's bad target is reported once, not again for the override inheriting it
    paths = paths_of({"slos": [{"ttft": {"target": 1.5}},
                               {"model": "m", "stall": {"threshold_seconds": 3}}]})
    assert paths == ["slos[0].ttft.target"]
    paths = paths_of({"slos": [{}, {"model": "m", "ttft": {"target": 2}}]})
    assert paths == ["slos[1].ttft.target"]


def test_a_duplicated_override_is_an_error():
    errors = errors_of({"slos": [{}, {"model": "m", "route": "r"},
                                 {"model": "m", "route": "r", "ttft": {"target": 0.9}}]})
    assert errors == [("slos[2]", "the same model and route as slos[1]: merge the two entries")]


def test_a_conflict_is_reported_at_the_key_the_user_wrote():
    # buckets written above a written max_seconds: both written, the buckets are blamed
    errors = errors_of({"histograms": {"max_seconds": 60, "seconds_buckets": [1, 120]}})
    assert [p for p, _ in errors] == ["histograms.seconds_buckets"]
    assert "largest bucket (120 s)" in errors[0][1]
    # buckets not written: the default layout (to 3600 s) is cut at the max_seconds written
    assert config_loader.load({"histograms": {"max_seconds": 60}}).seconds_buckets()[-1] == 60
    # a default threshold (10 s first-answer objective) above a written max_seconds
    assert "histograms.max_seconds" in paths_of(
        {"histograms": {"max_seconds": 5, "seconds_buckets": [1, 2]}})
    # a value rejected for its type is not blamed again by a check it takes part in
    assert paths_of({"histograms": {"max_seconds": "x", "seconds_buckets": [1, 5000]}}) == \
        ["histograms.max_seconds"]
    assert paths_of({"aggregator": {"tls_cert_file": "c"}}) == ["aggregator.tls_cert_file"]


def test_numbers_out_of_range():
    assert paths_of({"server": {"port": -1}}) == ["server.port"]
    assert paths_of({"server": {"port": 70000}}) == ["server.port"]
    assert config_loader.load({"server": {"port": 0}}).server.port == 0  # any free port
    assert paths_of({"window": {"seconds": 0.00000001}}) == ["window.seconds"]


def test_the_histogram_modes_the_config_accepts_are_the_ones_the_queries_know():
    """`dashboards.histograms` picks one of promql.MODES; any other value is the user's
    mistake, reported at its key (never a KeyError when the generators start)."""
    for name, mode in promql.MODES.items():
        loaded = config_loader.load({"dashboards": {"histograms": name}})
        assert promql.histogram_mode(loaded) is mode and mode.name == name
    assert paths_of({"dashboards": {"histograms": "exponential"}}) == ["dashboards.histograms"]


def test_yaml_files_name_the_line(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("labels:\n  max_tenants: 5\nwindow:\n  seconds: 30\n")
    assert config_loader.load(good).labels.max_tenants == 5
    bad = tmp_path / "bad.yaml"
    bad.write_text("labels:\n  max_tenants: 5\n\nwindow:\n  slices: 100\n")
    with pytest.raises(ConfigError) as info:
        config_loader.load(bad)
    assert str(info.value) == f"{bad}:5: window.slices: must be between 1 and 60, got 100"
    broken = tmp_path / "broken.yaml"
    broken.write_text("labels: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        config_loader.load(broken)
    assert str(info.value).startswith(f"{broken}: not valid YAML: line 2, column 1: ")


def test_unreadable_files_get_one_clear_line(tmp_path):
    with pytest.raises(ConfigError) as info:
        config_loader.load(tmp_path / "missing.yaml")
    assert str(info.value) == (f"{tmp_path / 'missing.yaml'}: cannot read the file: "
                               f"No such file or directory")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("labels:\n  hash_salt: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        config_loader.load(latin)
    assert str(info.value) == f"{latin}: not UTF-8 text (byte 0xe9 at offset 24)"


def test_aliases_cannot_blow_up_the_messages(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                    "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c]\n"
                    "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e]\n"
                    "labels: {tenant_allowlist: [*f, *f]}\n")
    with pytest.raises(ConfigError) as info:
        config_loader.load(bomb)
    assert len(str(info.value)) < 300 and "YAML aliases" in str(info.value)
    small = tmp_path / "small.yaml"  # a few aliases are fine, and messages stay short
    small.write_text("slos: [{ttft: &s {target: 2.5}}, {model: m, stall: *s}]\n"
                     "labels: {max_tenants: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, "
                     "14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26]}\n")
    with pytest.raises(ConfigError) as info:
        config_loader.load(small)
    assert [p for p, _ in info.value.errors] == [
        "slos[0].ttft.target", "slos[1].stall.target", "labels.max_tenants"]
    assert info.value.errors[2][1] == "expected int, got a list [1, 2, 3, 4, 5, 6, 7, 8, 9, " \
                                      "10, 11, 12, 13, 14, 15, 16, 1..."


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_give_a_config_error_or_a_config(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("fuzz") / "c.yaml"
    path.write_bytes(data)
    try:
        assert isinstance(config_loader.load(path), Config)
    except ConfigError as e:
        assert str(e).startswith(str(path))


def test_check_config_cli(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("labels:\n  max_tenants: 0\n  nope: 1\nserver: {port: 70000}\n")
    run = subprocess.run([*CLI, "check-config", str(bad)], capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.splitlines() == [  # every error at once, in the file's order
        f"{bad}:2: labels.max_tenants: must be at least 1, got 0",
        f"{bad}:3: labels.nope: unknown key (known: expire_seconds, hash_salt, max_label_length, "
        f"max_models, max_providers, max_routes, max_series, max_tasks, max_tenants, max_upstreams, "
        f"tenant_allowlist, tenant_families, tenant_policy)",
        f"{bad}:4: server.port: must be between 0 (any free port) and 65535, got 70000"]
    good = tmp_path / "good.yaml"
    good.write_text("labels:\n  max_tenants: 3\n")
    run = subprocess.run([*CLI, "check-config", str(good)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    for argv in (["check-config", str(tmp_path / "missing.yaml")],
                 ["serve", "--port", "70000"], ["serve", "--config", str(bad)]):
        run = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=30)
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
        assert run.stderr.strip(), argv


def test_check_config_checks_the_files_and_address_serve_needs(tmp_path):
    """Every file serve reads and the address it listens on, checked at once, each error at
    its key's line; then the same config given to serve: refused too, naming a key."""
    empty, folder = tmp_path / "empty", tmp_path / "folder"
    empty.write_text("\n")
    folder.mkdir()
    cert = tmp_path / "cert.pem"
    cert.write_text("not a certificate\n")
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server:\n"
        "  addr: no-such-host.invalid\n"
        "aggregator:\n"
        f"  push_token_file: {tmp_path / 'missing'}\n"
        f"  metrics_token_file: {empty}\n"
        "  metrics_username: prometheus\n"
        f"  metrics_password_file: {folder}\n"
        f"  tls_cert_file: {cert}\n"
        f"  tls_key_file: {cert}\n"
        f"  snapshot_path: {tmp_path / 'gone' / 'state'}\n")
    run = subprocess.run([*CLI, "check-config", str(config)], capture_output=True, text=True,
                         timeout=30)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    lines = run.stderr.splitlines()
    assert [line.split(": ")[0:2] for line in lines] == [
        [f"{config}:2", "server.addr"], [f"{config}:4", "aggregator.push_token_file"],
        [f"{config}:5", "aggregator.metrics_token_file"],
        [f"{config}:7", "aggregator.metrics_password_file"],
        [f"{config}:8", "aggregator.tls_cert_file"], [f"{config}:10", "aggregator.snapshot_path"]]
    assert "cannot listen on 'no-such-host.invalid'" in lines[0]
    assert lines[1].endswith("No such file or directory") and lines[2].endswith("is empty")
    assert lines[3].endswith("Is a directory") and f"cannot load {cert}" in lines[4]
    assert lines[5].endswith(f"the directory {tmp_path / 'gone'} does not exist")
    run = subprocess.run([*CLI, "serve", "--config", str(config), "--port", "0"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and run.stderr.startswith(f"{config}:2: server.addr: cannot "
                                                         f"listen on 'no-such-host.invalid'")
    run = subprocess.run([*CLI, "serve", "--addr", "10.255.255.254", "--port", "0"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and run.stderr == (
        "command line: --addr: cannot listen on '10.255.255.254': Cannot assign requested "
        "address\n")


def test_check_config_tries_the_snapshot_directory_and_names_what_needs_the_runtime(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("aggregator:\n  snapshot_path: /sys/ttft-state\n")  # (read-only, even
    run = subprocess.run([*CLI, "check-config", str(config)], capture_output=True, text=True,
                         timeout=30)  # for root)
    assert run.returncode == 2 and run.stderr.startswith(
        f"{config}:2: aggregator.snapshot_path: cannot use /sys")
    assert run.stderr.rstrip().endswith("Permission denied")
    config.write_text(f"aggregator:\n  snapshot_path: {tmp_path / 'state'}\n")
    run = subprocess.run([*CLI, "check-config", str(config)], capture_output=True, text=True,
                         timeout=30)
    assert run.returncode == 0 and run.stdout == (
        f"{config}: ok (not checked until serve starts: whether server.port is free, and the "
        f"snapshot's content (one that cannot be read is set aside and logged))\n")
    assert list(tmp_path.iterdir()) == [config]  # checking wrote nothing


def test_serve_names_an_unusable_snapshot_path(tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text(f"aggregator: {{snapshot_path: {tmp_path / 'missing' / 'state'}}}\n")
    run = subprocess.run([*CLI, "serve", "--config", str(config), "--port", "0"],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and run.stderr == (
        f"config: aggregator.snapshot_path: the directory {tmp_path / 'missing'} does not "
        f"exist\n")
