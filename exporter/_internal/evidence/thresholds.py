"""What the cause decision (diagnose/causes.py) can name and how much it asks: the four causes
and `unknown`, the runbook section of each, and the decision's thresholds. Below both the
decision and what tells on-call about it (generate/cause_rules.py, cause_panels.py, the
reference), so that the rules, the panels and the decision never hold two copies of a number.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFILL_SURGE = "prefill_surge"
COLD_CACHE = "cold_cache"
NOISY_NEIGHBOUR = "noisy_neighbour"
ROUTE_CHANGE = "route_change"
UNKNOWN = "unknown"
#: In the order the decision tries them: a changed upstream is a fact, not an inference; so is
#: a cache that serves a few slower tenants next to nothing any more, where a route's mean
#: prompt over a window may be a few long ones; and longer prompts explain stalls (a huge
#: prefill blocks the batch) where stalls do not explain longer prompts.
CAUSES: tuple[str, ...] = (ROUTE_CHANGE, COLD_CACHE, PREFILL_SURGE, NOISY_NEIGHBOUR, UNKNOWN)

#: Section of docs/runbooks.md per cause (the demo's incident of that failure mode).
RUNBOOK = {
    PREFILL_SURGE: "Incident: long-prompt prefill surge",
    COLD_CACHE: "Incident: prompt cache gone cold after idling",
    NOISY_NEIGHBOUR: "Incident: noisy neighbour freezing every stream",
    ROUTE_CHANGE: "Incident: silent route change to a farther region",
    UNKNOWN: "LLMTTFTLikelyCause",
}


@dataclass(frozen=True)
class Thresholds:
    """The decision's thresholds (docs/runbooks.md, "Why is TTFT up?", gives the reasoning)."""

    #: Calls a (model, route) needs in each window to be compared at all (the rules use
    #: `alerting.min_calls`).
    min_calls: int = 20
    #: ...and a tenant in the diagnosed window, to be compared with its (model, route).
    tenant_min_calls: int = 2
    #: TTFT (or first-answer) mean now / baseline, and now - baseline, that count as degraded.
    degraded_factor: float = 1.25
    degraded_min_seconds: float = 0.1
    #: ...and by this many standard errors of the difference of the two means: a mean over a
    #: few dozen calls of a route that mixes cached and uncached prompts moves by more than
    #: 25 % on its own (each call's spread is read from the log values in its buckets).
    degraded_z: float = 3.5
    #: ...or by this many where the rise's mechanism is measured on its own: a prefill surge's
    #: signals hold (the uncached work per call rose clearly, the prefill with it at the
    #: server's usual speed), or most calls reached an upstream the baseline did not see. A
    #: surge of the prompts' new part makes TTFT a mix of calls that carry it and calls that
    #: do not, and a long-prompt route's TTFT spreads wide with its prompts: a real rise reads
    #: few log standard errors over two dozen calls.
    explained_z: float = 2.0
    #: route_change: share of the route's calls that reached an upstream unseen in the
    #: baseline,
    new_upstream_share: float = 0.5
    #: or the connect phase's mean up by a round trip and more;
    connect_factor: float = 2.0
    connect_min_seconds: float = 0.05
    #: ...and the network phases (connect + server wait means) rose by at least this share of
    #: the TTFT rise: a farther route adds round trips and nothing else, so its rise is made
    #: of them. Needed for a connect-cost rise always (a loaded client event loop makes each
    #: loopback connect dearer beside a neighbour's 1.7 s rise), and for a new upstream where
    #: a surge's or a cache loss's own signals hold (a fingerprint rollout during a surge).
    network_share: float = 0.5
    #: prefill_surge: uncached input tokens per call and the prefill phase's mean, now /
    #: baseline (the server prefills only what its cache does not serve). No ceiling on the
    #: prefill's seconds per token: attention grows with the position and the engine queues
    #: behind longer prefills, so a real surge is slower per token (×2.3 at 4k -> 40k).
    input_factor: float = 1.4
    prefill_factor: float = 1.25
    #: noisy_neighbour: a neighbour in the batch slows every stream's decoding: the mean time
    #: per output token up this many times with the uncached work unchanged...
    slower_decode: float = 1.3
    #: ...or the mean of each call's largest stall, now / baseline and now - baseline. A
    #: longer wait before the first token alone is no neighbour (hidden reasoning, a queue).
    stall_factor: float = 1.5
    stall_min_seconds: float = 0.05
    #: cold_cache: a tenant's cached share of input tokens fell by this much (absolute)...
    cache_drop: float = 0.25
    #: ...to at most this share of its baseline, and its cached tokens per call too: a cold
    #: cache is gone, where a warm tenant's share dips to a third or a half whenever its
    #: prompts outgrow their cached prefix (and longer prompts alone lower the share only).
    cache_ratio: float = 0.2
    #: ...over at least this many calls of the tenant on the model: an idle tenant's cache
    #: comes back warm after one cold call per prompt prefix (the demo's tail tenants: 2-3
    #: calls a window, all cold), a cold cache stays cold (its incident: 7-30 calls).
    cold_min_calls: int = 5
    #: a starved client (CPU, event loop): the queue phase, before the request leaves the
    #: process, up by this factor and this many seconds, with no more of the provider's
    #: retries. Every phase the client stamps is late then, so no provider-side cause (and no
    #: route change) is named from the phases.
    queue_factor: float = 2.0
    queue_min_seconds: float = 0.02
    #: the provider's retries per call (rate limited, overloaded, server error) up this many
    #: times and by this many per call: an overloaded provider holds each call's connection
    #: longer, so the pool's wait (the queue phase) grows with it; not a starved client.
    retry_factor: float = 2.0
    retry_min_per_call: float = 0.02


DEFAULT = Thresholds()
