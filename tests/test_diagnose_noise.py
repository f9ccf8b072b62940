"""The noise gate (diagnose/noise.py) and the new-upstream share (diagnose/upstreams.py) on
known inputs, and the evaluation generator (bench/diagnose_eval.py) on a few seeds."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from bench.diagnose_eval import gate_false_rate, main as evaluate
from exporter._internal.config.settings import DEFAULT_SECONDS_BUCKETS, DEFAULT_TOKEN_BUCKETS
from exporter._internal.diagnose.causes import Window, classify
from exporter._internal.evidence.thresholds import DEFAULT
from exporter._internal.evidence.signals import OPENED
from exporter._internal.diagnose.noise import (LogMoments, from_cumulative, log_moments, opened,
                                               rise_in_standard_errors)
from exporter._internal.diagnose.upstreams import new_upstream_shares


def classic(values: np.ndarray) -> list[tuple[float, float, float]]:
    """`values` as the exporter's classic buckets serve them (cumulative, then per bucket)."""
    rows = [(b, float(np.count_nonzero(values <= b))) for b in DEFAULT_SECONDS_BUCKETS]
    return from_cumulative([*rows, (math.inf, float(values.size))])


def test_log_moments_from_the_buckets_are_the_calls_log_moments() -> None:
    values = np.random.default_rng(3).lognormal(math.log(0.4), 0.8, 20_000)
    moments = log_moments(classic(values))
    assert moments is not None and moments.calls == 20_000
    assert moments.mean == pytest.approx(math.log(0.4), abs=0.03)
    # Sheppard's correction makes the buckets' variance a little larger, never smaller
    assert 0.64 <= moments.variance <= 0.64 * 1.15


def test_the_buckets_rows_become_per_bucket_counts() -> None:
    assert from_cumulative([(0.1, 2.0), (math.inf, 5.0), (0.5, 4.0)]) == [
        (0.0, 0.1, 2.0), (0.1, 0.5, 2.0), (0.5, math.inf, 1.0)]
    assert opened([(0.0, 0.005, 9.0), (0.005, 0.1, 1.0)]) == [(0.005, 0.1, 1.0)]
    assert log_moments([(0.0, 0.1, 0.0)]) is None


def test_a_doubling_is_clear_and_the_same_distribution_is_not() -> None:
    rng = np.random.default_rng(4)
    base = log_moments(classic(rng.lognormal(math.log(0.3), 1.0, 200)))
    same = log_moments(classic(rng.lognormal(math.log(0.3), 1.0, 200)))
    doubled = log_moments(classic(rng.lognormal(math.log(0.6), 1.0, 200)))
    assert abs(rise_in_standard_errors(same, base)) < 3.5  # type: ignore[arg-type]
    assert rise_in_standard_errors(doubled, base) > 3.5  # type: ignore[operator]
    assert rise_in_standard_errors(doubled, log_moments([(0.1, 0.2, 1.0)])) is None


def test_the_log_gate_passes_identical_heavy_tailed_windows_rarely() -> None:
    """Measured, not assumed: 1,000 pairs of identical 30-call lognormal windows."""
    logged, spread = gate_false_rate(pairs=1000)
    assert logged <= 0.005 and spread > logged, (logged, spread)


def test_a_move_is_judged_per_route_and_the_fold_never_hides_it() -> None:
    near, far, other = ("a:443", "near", "fp"), ("b:443", "far", "fp"), ("__other__",) * 3
    base = {("m", "r1", *near): 100.0, ("m", "r2", *near): 100.0, ("m", "r3", *other): 50.0,
            ("m", "r3", *near): 50.0}
    now = {("m", "r1", *near): 100.0, ("m", "r2", *far): 90.0, ("m", "r2", *near): 10.0,
           ("m", "r3", *other): 95.0, ("m", "r3", *near): 5.0, ("m", "r4", *near): 10.0}
    shares = new_upstream_shares(now, base)
    assert shares[("m", "r1")] == 0.0  # the model's other route moved: not this one
    assert shares[("m", "r2")] == pytest.approx(0.9)
    assert shares[("m", "r3")] == pytest.approx(0.95 - 0.5)  # folded identities took over
    assert ("m", "r4") not in shares  # no upstream seen in its baseline: nothing to compare


def test_the_evaluation_runs_and_reports_every_cause(capsys: pytest.CaptureFixture[str]) -> None:
    assert evaluate(["--tune", "0:60", "--held-out", "100000:100060", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    for line in ("| prefill_surge |", "| calm |", "| client_cpu_starvation |",
                 "False findings on calm window pairs"):
        assert line in out



def _window(ttft: np.ndarray, given: np.ndarray, uncached: np.ndarray, prefill: np.ndarray
            ) -> Window:
    """A (model, route) window of these calls as diagnose reads it: TTFT, input tokens `given`
    of which `uncached` the server prefilled; log values from the classic buckets."""
    tokens = [(b, float(np.count_nonzero(given <= b))) for b in DEFAULT_TOKEN_BUCKETS]
    w = Window(calls=float(ttft.size), ttft=float(ttft.mean()), first_answer=float(ttft.mean()),
               input_tokens=float(given.mean()), uncached_per_call=float(uncached.mean()),
               stall=0.05, phases={"prefill": float(prefill.mean()), "queue": 0.003})
    w.logs = {"ttft": log_moments(classic(ttft)), "first_answer": log_moments(classic(ttft)),
              "input_tokens": log_moments(from_cumulative([*tokens, (math.inf, given.size)]))}
    return w


def test_a_surge_needs_less_evidence_of_its_own_rise_than_an_unexplained_one() -> None:
    """A surge of the prompts' new part, as the incident day plays it: every prompt ×9, but the
    provider prefills only the growth past a tenant's last prompt, so some calls carry the
    whole surge and the rest little of it. TTFT's log values then spread wide: its rise is
    clear of `explained_z` but not of `degraded_z`, while the work's rise is clear by far. The
    same TTFT and prefill rise without more work stays unexplained, and is not degraded."""
    rng = np.random.default_rng(2)
    speed = 1 / 20_000  # prefill seconds per uncached token
    base_given = rng.lognormal(math.log(2_000), 0.57, 50)
    base_ttft = rng.lognormal(math.log(0.05), 0.6, 50) + base_given * speed  # wait + prefill
    surged = rng.random(24) < 0.4
    now_given = rng.lognormal(math.log(2_000), 0.57, 24) * 9
    now_uncached = np.where(surged, now_given, now_given / 9)
    now_ttft = rng.lognormal(math.log(0.05), 0.6, 24) + now_uncached * speed
    base = _window(base_ttft, base_given, base_given, base_given * speed)
    surge = _window(now_ttft, now_given, now_uncached, now_uncached * speed)
    z = rise_in_standard_errors(surge.logs["ttft"], base.logs["ttft"])
    assert z is not None and DEFAULT.explained_z <= z < DEFAULT.degraded_z
    found = classify("m", "search", surge, base, replace(DEFAULT, min_calls=5))
    assert found is not None and found.cause == "prefill_surge", found
    unexplained = _window(now_ttft, base_given[:24], base_given[:24], now_uncached * speed)
    assert classify("m", "search", unexplained, base, replace(DEFAULT, min_calls=5)) is None


def test_dearer_connections_name_a_route_change_beside_a_stall_rise() -> None:
    """The route change as the watch first sees it (the diagnosed window holds calls of the
    farther route, its stalls a little longer; the baseline one call that opened a
    connection): each connection costs ~9× more, which no neighbour, surge or cold cache
    does, so it is a route change. More calls opening connections at the same cost, or no
    opened call in the baseline to compare, leave the stall rise to name a neighbour. The
    phases are the calls' own: the connect mean is the opened calls' cost × their share, and
    the farther route adds a round trip (a third of a handshake) to every server wait."""
    def window(opened_connect: LogMoments | None, stall: float, ttft: float,
               calls: float = 20) -> Window:
        share = 0.0 if opened_connect is None else opened_connect.calls / calls
        cost = 0.0 if opened_connect is None else math.exp(opened_connect.mean)
        w = Window(calls=calls, ttft=ttft, stall=stall,
                   phases={"queue": 0.003, "connect": share * cost, "prefill": 0.055,
                           "server": 0.06 + cost / 3})
        w.logs = {"ttft": LogMoments(calls, math.log(ttft), 0.3)}
        if opened_connect is not None:
            w.logs[OPENED] = opened_connect
        return w

    strict = replace(DEFAULT, min_calls=5)
    base = window(LogMoments(1.03, math.log(0.016), 0.07), stall=0.07, ttft=0.137, calls=49)
    far = window(LogMoments(19.1, math.log(0.138), 0.066), stall=0.125, ttft=0.385)
    found = classify("deepseek-r1", "chat", far, base, strict)
    assert found is not None and found.cause == "route_change", found
    same_cost = window(LogMoments(19.1, math.log(0.016), 0.066), stall=0.125, ttft=0.385)
    found = classify("deepseek-r1", "chat", same_cost, base, strict)
    assert found is not None and found.cause == "noisy_neighbour", found
    unseen = window(None, stall=0.07, ttft=0.137, calls=49)
    found = classify("deepseek-r1", "chat", far, unseen, strict)
    assert found is not None and found.cause == "noisy_neighbour", found


def test_a_move_to_a_new_upstream_needs_less_evidence_of_the_rise() -> None:
    """A long-prompt route moved to a farther region: its TTFT ×1.6 over two dozen calls reads
    under 3.5 log standard errors (prompts spread it wide), but every call reached an upstream
    the baseline never saw: a route change. Without the new upstream the same rise is no
    finding."""
    def window(ttft: float, calls: float, share: float | None) -> Window:
        w = Window(calls=calls, ttft=ttft, stall=0.09, new_upstream_share=share,
                   phases={"queue": 0.003, "prefill": 0.8, "server": 0.3})
        w.logs = {"ttft": LogMoments(calls, math.log(ttft), 0.6)}
        return w

    base = window(0.85, 50, None)
    moved = window(1.4, 18, 1.0)
    z = rise_in_standard_errors(moved.logs["ttft"], base.logs["ttft"])
    assert z is not None and DEFAULT.explained_z <= z < DEFAULT.degraded_z
    found = classify("deepseek-r1", "summarize", moved, base, replace(DEFAULT, min_calls=5))
    assert found is not None and found.cause == "route_change", found
    stayed = window(1.4, 18, 0.0)
    assert classify("deepseek-r1", "summarize", stayed, base, replace(DEFAULT, min_calls=5)) is None
