"""Label guard: tenant policies, the per-(model, route) cap, sanitising; all counted."""

from exporter._internal import names
from exporter._internal.config.settings import LabelConfig
from exporter._internal.record.guard import LabelGuard
from exporter._internal.record.store import no_rows


def test_raw_policy_caps_tenants_per_model_and_route():
    guard = LabelGuard(LabelConfig(max_tenants=2), no_rows())
    assert [guard.tenant("m", "r", t) for t in ("a", "b", "c", "a", "d")] == \
        ["a", "b", names.OTHER_TENANT, "a", names.OTHER_TENANT]
    assert guard.tenant("m", "other-route", "c") == "c"  # the cap is per (model, route)
    assert guard.rows[names.SELF_TENANT_FOLDS] == {("m", "r"): 2}


def test_hash_policy_is_stable_salted_and_not_reversible_by_eye():
    guard = LabelGuard(LabelConfig(tenant_policy="hash", hash_salt="s1"), no_rows())
    first = guard.tenant("m", "r", "acme-corp")
    assert first == guard.tenant("m", "r", "acme-corp")
    assert first.startswith("t-") and len(first) == 14 and "acme" not in first
    other_salt = LabelGuard(LabelConfig(tenant_policy="hash", hash_salt="s2"), no_rows())
    assert other_salt.tenant("m", "r", "acme-corp") != first


def test_allowlist_policy_folds_everyone_else():
    guard = LabelGuard(LabelConfig(tenant_policy="allowlist", tenant_allowlist=("gold",)),
                       no_rows())
    assert guard.tenant("m", "r", "gold") == "gold"
    assert guard.tenant("m", "r", "random") == names.OTHER_TENANT
    assert guard.rows[names.SELF_TENANT_FOLDS] == {("m", "r"): 1}


def test_bad_values_are_cleaned_and_counted():
    guard = LabelGuard(LabelConfig(max_label_length=10), no_rows())
    assert guard.clean("ok") == "ok" and bad_labels(guard) == 0
    assert guard.clean("x" * 50) == "x" * 10
    assert guard.clean("line\nbreak") == "line_break"
    assert guard.clean(None) == names.UNKNOWN
    assert guard.clean(42) == "42"
    assert bad_labels(guard) == 4
    assert guard.tenant("m", "r", "") == names.UNKNOWN  # no tenant is not a bad label
    assert bad_labels(guard) == 4


def bad_labels(guard: LabelGuard) -> int:
    return guard.rows[names.SELF_DROPS].get((names.DROP_BAD_LABEL,), 0)
