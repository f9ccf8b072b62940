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


def test_a_recorder_records_what_its_guard_answers_at_every_call():
    """The recorder skips the guard for (model, provider, route, tenant) values it answered
    with themselves before (recorder._kept_calls): every call must still be recorded under what
    the guard answers, and the guard's folds and drops counted as if it had been asked, under
    each tenant policy, past the caps, with values it cleans."""
    import random
    from collections import Counter

    from exporter._internal.config.settings import Config
    from exporter._internal.record.recorder import Recorder
    from exporter._internal.record.timeline import CallTimeline

    policies = [LabelConfig(max_tenants=3, max_models=3),
                LabelConfig(tenant_policy="hash", hash_salt="s", max_tenants=3),
                LabelConfig(tenant_policy="allowlist", tenant_allowlist=("t1", "t2"))]
    for labels in policies:
        rng = random.Random(3)
        recorder = Recorder(Config(labels=labels))
        guard = LabelGuard(labels, no_rows())
        expected: Counter = Counter()
        for _ in range(400):
            model = rng.choice(["m1", "m2", "m3", "m4", "bad\nmodel"])
            route = rng.choice(["/a", "/b"])
            tenant = rng.choice(["t1", "t2", "t3", "t4", "t5", "", names.OTHER_TENANT, "x\ty"])
            recorder.record_call(CallTimeline(start=0, model=model, provider="p", route=route,
                                              tenant=tenant, end=1000, outcome=names.OK))
            m, p, r = (guard.value(names.MODEL, model), guard.value(names.PROVIDER, "p"),
                       guard.value(names.ROUTE, route))
            t = names.UNKNOWN if tenant == "" else guard.tenant(m, r, tenant)
            expected[(m, names.OK, p, r, t)] += 1
        assert recorder.counts().rows[names.REQUESTS_TOTAL] == dict(expected)
        for counter in (names.SELF_TENANT_FOLDS, names.SELF_DROPS):
            assert recorder.rows[counter] == guard.rows[counter], (labels, counter)
