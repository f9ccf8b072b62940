"""The alerts on the exporter's own losses: values dropped, pushes refused, batches the workers
gave up, failed snapshot or journal writes, and calls whose label was folded into `__other__`.

Each event loses calls (or their label, or, for a snapshot, the restart safety), however rare,
so each alert is `increase(counter[1h]) > 0` with no `for`: a ticket on one event, at the first
evaluation that sees it, resolved an hour after the last. A rate held above zero `for` as long
as its own window can never fire on one event: its rate is above zero for one scrape less than
the window. `increase` reads a counter reset (a restart) as no event, and counts the first
event of a series that appears at zero, which the exposition guarantees: every counter with a
fixed set of rows serves them at zero from the start, and a scraper sees every new series at
zero first (expose/debut.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable

from .. import names
from ..config.settings import Config
from ..promql import duration, scope_matchers, selector

#: How far back the loss alerts look, and so how long one event keeps its alert firing.
LOSS_WINDOW = 3600
_COUNT = '{{ $value | printf "%.0f" }}'
#: Upstream identities past `labels.max_upstreams` fold by design (a provider rotating its
#: addresses), and diagnose reads the fold as a new upstream: no alert.
_NOT_UPSTREAM = f'{names.LABEL}!="{names.FOLD_UPSTREAM}"'


def loss_alerts(config: Config, alert: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    """`TTFTExporterDroppingSamples`, `TTFTExporterPushRejected`,
    `TTFTExporterPushBatchesLost`, `TTFTExporterSnapshotFailing`,
    `TTFTExporterLabelFolding` and (unless tenants are allow-listed) `TTFTExporterTenantFolding`;
    `alert` is alerts._alert."""
    scope = scope_matchers(config.alerting)
    window = duration(LOSS_WINDOW * config.alerting.window_scale)
    hour = f"the last {duration(LOSS_WINDOW)}"

    def increase(metric: str, labels: Sequence[str] = (), matchers: Sequence[str] = ()) -> str:
        return (f"sum by ({', '.join(['job', 'instance', *labels])}) "
                f"(increase({selector(metric, [*scope, *matchers])}[{window}])) > 0")

    rules = [
        alert(
            "TTFTExporterDroppingSamples", "ticket", increase(names.SELF_DROPS, [names.REASON]),
            "0s", "ttft-exporter drops samples ({{ $labels.reason }}): {{ $labels.instance }}",
            f"{{{{ $labels.instance }}}} dropped {_COUNT} values for reason "
            f"{{{{ $labels.reason }}}} over {hour}: the metrics undercount or mislabel.",
            config),
        alert(
            "TTFTExporterPushRejected", "ticket", increase(names.SELF_PUSH_REJECTED,
                                                           [names.REASON]),
            "0s", "ttft-exporter refuses pushes ({{ $labels.reason }}): {{ $labels.instance }}",
            f"{{{{ $labels.instance }}}} refused pushes for reason {{{{ $labels.reason }}}} "
            f"over {hour} ({_COUNT}): the calls in them are not counted.", config),
        alert(
            "TTFTExporterPushBatchesLost", "ticket", increase(names.SELF_PUSH_LOST), "0s",
            "ttft-exporter workers lost push batches: {{ $labels.instance }}",
            f"Push workers reported by {{{{ $labels.instance }}}} gave up batches over {hour} "
            f"({_COUNT}; queue bound, refused, or unacknowledged at exit): the calls in them "
            f"are not counted.", config),
        alert(
            "TTFTExporterSnapshotFailing", "ticket", increase(names.SELF_SNAPSHOT_FAILURES),
            "0s", "ttft-exporter cannot write its state: {{ $labels.instance }}",
            f"{{{{ $labels.instance }}}} failed to write its snapshot or journal over {hour} "
            f"({_COUNT}): pushes it cannot journal are answered 503 (workers keep and resend them, "
            f"and drop the oldest past push.max_pending_bytes), and a restart may lose what the "
            f"last snapshot missed.", config),
        alert(
            "TTFTExporterLabelFolding", "ticket",
            increase(names.SELF_LABEL_FOLDS, [names.LABEL], [_NOT_UPSTREAM]), "0s",
            f"Calls folded into {names.OTHER_TENANT} ({{{{ $labels.label }}}}): "
            f"{{{{ $labels.instance }}}}",
            f"{{{{ $labels.instance }}}} recorded {_COUNT} calls or tasks under "
            f"{names.OTHER_TENANT} for their {{{{ $labels.label }}}} over {hour}: the label "
            f"reached its cap (labels.max_models, max_routes, max_providers or max_tasks; for "
            f"series, a family reached labels.max_series rows), so the panels and alerts of "
            f"each value no longer see the folded ones.", config),
    ]
    # With an allowlist, folding every other tenant is the configured behaviour, not a loss.
    if config.labels.tenant_policy != "allowlist":
        per = "{{ $labels.model }} / {{ $labels.route }}"
        rules.append(alert(
            "TTFTExporterTenantFolding", "ticket",
            increase(names.SELF_TENANT_FOLDS, [names.MODEL, names.ROUTE]), "0s",
            f"Tenants folded into {names.OTHER_TENANT}: {per}",
            f"{_COUNT} calls of {per} were recorded under tenant {names.OTHER_TENANT} on "
            f"{{{{ $labels.instance }}}} over {hour}: the model and route have more than "
            f"labels.max_tenants ({config.labels.max_tenants}) tenants, so per-tenant panels "
            f"and the tenant alerts no longer see all of them.", config))
    return rules
