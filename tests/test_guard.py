"""Label guard: tenant policies, the per-(model, route) cap, sanitising; all counted."""

from exporter._internal import names
from exporter._internal.config.settings import LabelConfig
from exporter._internal.record.guard import LabelGuard


def test_raw_policy_caps_tenants_per_model_and_route():
    guard = LabelGuard(LabelConfig(max_tenants=2))
    assert [guard.tenant("m", "r", t) for t in ("a", "b", "c", "a", "d")] == \
        ["a", "b", names.OTHER_TENANT, "a", names.OTHER_TENANT]
    assert guard.tenant("m", "other-route", "c") == "c"  # the cap is per (model, route)
    assert guard.folds == {("m", "r"): 2}


def test_hash_policy_is_stable_salted_and_not_reversible_by_eye():
    guard = LabelGuard(LabelConfig(tenant_policy="hash", hash_salt="s1"))
    first = guard.tenant("m", "r", "acme-corp")
    assert first == guard.tenant("m", "r", "acme-corp")
    assert first.startswith("t-") and len(first) == 14 and "acme" not in first
    other_salt = LabelGuard(LabelConfig(tenant_policy="hash", hash_salt="s2"))
    assert other_salt.tenant("m", "r", "acme-corp") != first


def test_allowlist_policy_folds_everyone_else():
    guard = LabelGuard(LabelConfig(tenant_policy="allowlist", tenant_allowlist=("gold",)))
    assert guard.tenant("m", "r", "gold") == "gold"
    assert guard.tenant("m", "r", "random") == names.OTHER_TENANT
    assert guard.folds == {("m", "r"): 1}


def test_bad_values_are_cleaned_and_counted():
    guard = LabelGuard(LabelConfig(max_label_length=10))
    assert guard.clean("ok") == "ok" and guard.bad_labels == 0
    assert guard.clean("x" * 50) == "x" * 10
    assert guard.clean("line\nbreak") == "line_break"
    assert guard.clean(None) == names.UNKNOWN
    assert guard.clean(42) == "42"
    assert guard.bad_labels == 4
    assert guard.tenant("m", "r", "") == names.UNKNOWN  # no tenant is not a bad label
    assert guard.bad_labels == 4
