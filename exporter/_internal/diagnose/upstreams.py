"""Which share of a route's calls reached an upstream its baseline did not see.

An upstream is an identity (address, region, system fingerprint) counted per (model, route) in
`llm_client_upstream_requests_total`; a route change is judged per route, so a move on one
route is never blamed on the model's others. Past `labels.max_upstreams` identities per model
the exporter folds new ones into `__other__` (record/guard.py), a row that may already hold
baseline traffic: a move into folded identities is read from that row's share rising, so the
fold never hides a move of the route's calls.
"""

from __future__ import annotations

from .. import names

#: (model, route, address, region, fingerprint) -> calls over a window
Identities = dict[tuple[str, ...], float]


def new_upstream_shares(now: Identities, base: Identities) -> dict[tuple[str, str], float]:
    """Per (model, route) with calls now and upstream calls in the baseline: the share of its
    calls now to identities with no calls in the baseline, plus the rise of the folded
    (`__other__`) identities' share."""
    def totals(rows: Identities) -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}
        for key, calls in rows.items():
            out[key[:2]] = out.get(key[:2], 0.0) + calls
        return out

    def folded_share(rows: Identities, route: tuple[str, str], total: float) -> float:
        return sum(calls for key, calls in rows.items()
                   if key[:2] == route and names.OTHER_TENANT in key[2:]) / total

    seen = {key for key, calls in base.items() if calls > 0}
    now_totals, base_totals = totals(now), totals(base)
    shares = {}
    for route, total in now_totals.items():
        if total <= 0 or base_totals.get(route, 0.0) <= 0:
            continue  # no upstream seen in one window: nothing to compare
        new = sum(calls for key, calls in now.items() if key[:2] == route
                  and key not in seen and names.OTHER_TENANT not in key[2:])
        rise = folded_share(now, route, total) - folded_share(base, route, base_totals[route])
        shares[route] = min(1.0, new / total + max(rise, 0.0))
    return shares
