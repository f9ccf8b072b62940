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


# --- expiry: a cap a hostile client filled is freed once it stops; a value in use stays ---

def test_tenant_slots_a_hostile_client_filled_are_freed_once_unseen_for_the_expiry():
    from exporter._internal.record.guard import EPOCHS

    guard = LabelGuard(LabelConfig(max_tenants=3), no_rows())
    assert guard.tenant("m", "r", "gold") == "gold"
    assert [guard.tenant("m", "r", f"forged-{i}") for i in range(5)] == \
        ["forged-0", "forged-1", names.OTHER_TENANT, names.OTHER_TENANT, names.OTHER_TENANT]
    assert guard.tenant("m", "r", "newcomer") == names.OTHER_TENANT  # the cap is full
    freed = []
    for _ in range(EPOCHS):  # the forged tenants stop; gold keeps calling every epoch
        assert guard.tenant("m", "r", "gold") == "gold"
        expired = guard.expire()
        freed += sorted(expired.tenants)
        assert not expired.values[names.MODEL]
    assert freed == []  # unseen for less than the expiry: still held
    assert guard.tenant("m", "r", "gold") == "gold"
    expired = guard.expire()
    assert sorted(expired.tenants) == [("m", "r", "forged-0"), ("m", "r", "forged-1")]
    assert guard.tenant("m", "r", "newcomer") == "newcomer"  # a freed slot
    assert guard.tenant("m", "r", "gold") == "gold"  # never evicted while in use
    assert guard._tenant_values == 2


def test_models_routes_providers_and_upstreams_expire_and_take_their_tenants_along():
    from exporter._internal.record.guard import EPOCHS

    guard = LabelGuard(LabelConfig(max_models=2, max_routes=2, max_providers=2,
                                   max_upstreams=1), no_rows())
    for model in ("m1", "m2"):
        guard.value(names.MODEL, model)
        guard.value(names.ROUTE, "r")
        guard.value(names.PROVIDER, "p")
        guard.tenant(model, "r", "t")
        guard.upstream(model, "10.0.0.1:443", "eu", "fp")
    assert guard.value(names.MODEL, "m3") == names.OTHER_TENANT
    assert guard.upstream("m1", "10.0.0.2:443", "eu", "fp") == (names.OTHER_TENANT,) * 3
    for _ in range(EPOCHS + 1):  # only m1, its route, provider, tenant and upstream in use
        guard.value(names.MODEL, "m1")
        guard.value(names.ROUTE, "r")
        guard.value(names.PROVIDER, "p")
        guard.tenant("m1", "r", "t")
        guard.upstream("m1", "10.0.0.1:443", "eu", "fp")
        expired = guard.expire()
    assert expired.values[names.MODEL] == {"m2"} and not expired.values[names.ROUTE]
    assert expired.tenants == set() and expired.upstreams == set()  # went with m2
    assert expired.covers((names.MODEL, names.TENANT), ("m2", "t"))
    assert not expired.covers((names.MODEL, names.ROUTE, names.TENANT), ("m1", "r", "t"))
    assert guard.value(names.MODEL, "m3") == "m3"
    assert guard._tenants == {("m1", "r"): {"t": guard.epoch - 1}}  # (seen before the tick)
    assert set(guard._upstreams) == {"m1"}
