"""The alerts on the exporter's own losses in push mode: refused pushes, batches the workers
gave up, failed snapshot or journal writes.

Each event loses calls (or, for a snapshot, the restart safety), however rare, so any increase
over the last hour is a ticket at once (no `for`), resolved an hour after the last one. The
internal errors of any role are drops (`dropped_total{reason="internal_error"}`), alerted by
`TTFTExporterDroppingSamples` in alerts.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable

from .. import names
from ..config.settings import Config
from ..promql import duration, scope_matchers, selector

#: How far back the loss alerts look.
LOSS_WINDOW = 3600
_COUNT = '{{ $value | printf "%.0f" }}'


def loss_alerts(config: Config, alert: Callable[..., dict[str, Any]]) -> list[dict[str, Any]]:
    """`TTFTExporterPushRejected`, `TTFTExporterPushBatchesLost`, `TTFTExporterSnapshotFailing`;
    `alert` is alerts._alert."""
    scope = scope_matchers(config.alerting)
    window = duration(LOSS_WINDOW * config.alerting.window_scale)
    hour = f"the last {duration(LOSS_WINDOW)}"

    def increase(metric: str, labels: Sequence[str] = ()) -> str:
        return (f"sum by ({', '.join(['job', 'instance', *labels])}) "
                f"(increase({selector(metric, scope)}[{window}])) > 0")

    return [
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
    ]
