"""grafanalib extended to the current Grafana dashboard model.

grafanalib 0.7.1 emits an old dashboard model (schemaVersion 12, the pre-Grafana-9 heatmap,
Stat thresholds as "", legacy keys such as `rows` and `span`). The small classes below extend it
to the current model: schemaVersion 39, the current `heatmap` panel reading Prometheus buckets
as-is (`calculate: false`, format `heatmap`), explicit thresholds, `bargauge` options, and every
panel and query bound to the `${datasource}` variable. This module changes when Grafana's model
does; what the dashboards show is in dashboards.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import attr
from grafanalib import core

SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}

#: Keys grafanalib emits that the current model dropped or that only carry null placeholders.
_LEGACY_PANEL_KEYS = frozenset({"span", "height", "minSpan", "error", "editable", "maxPerRow",
                                "repeatDirection", "hideTimeOverride", "maxDataPoints"})
_LEGACY_DASHBOARD_KEYS = ("__inputs", "gnetId", "hideControls", "rows", "sharedCrosshair",
                          "style")


def step(color: str, value: float | None = None) -> dict[str, Any]:
    """One threshold step; the first step of a list has no value (it is the base colour)."""
    return {"color": color, "value": value}


BASE = [step("green")]


def red_from(value: float) -> list[dict[str, Any]]:
    """Green below `value`, red from it on (an objective's threshold, an alert's limit)."""
    return [step("green"), step("red", value)]


@attr.s
class PromTarget(core.Target):
    """A Prometheus query bound to the datasource variable, without grafanalib's legacy keys."""

    #: Ask Grafana for the exemplars (trace ids) of the buckets this query reads.
    exemplar = attr.ib(default=False, validator=attr.validators.instance_of(bool))

    def to_json_data(self) -> dict[str, Any]:
        return {
            "datasource": DATASOURCE, "editorMode": "code", "exemplar": self.exemplar,
            "expr": self.expr, "format": self.format, "instant": self.instant,
            "range": not self.instant, "legendFormat": self.legendFormat, "refId": self.refId,
        }


class _Current:
    """Mixin for grafanalib panels: bind to the datasource variable, drop legacy/null keys."""

    def panel_json(self, overrides: dict[str, Any]) -> dict[str, Any]:
        data = super().panel_json(overrides)  # type: ignore[misc]
        if data.get("targets"):
            data["datasource"] = DATASOURCE
        return _drop_nulls({k: v for k, v in data.items() if k not in _LEGACY_PANEL_KEYS})


def _drop_nulls(data: dict[str, Any]) -> dict[str, Any]:
    """Remove grafanalib's null placeholders from nested mappings (lists are kept as they are:
    a threshold list's base step must keep its null value)."""
    return {k: _drop_nulls(v) if isinstance(v, dict) else v
            for k, v in data.items() if v is not None}


@attr.s
class TimeSeries(_Current, core.TimeSeries):
    pass


@attr.s
class Stat(_Current, core.Stat):
    pass


@attr.s
class Row(core.RowPanel):
    """An expanded row: only the keys the current model reads for one."""

    def to_json_data(self) -> dict[str, Any]:
        return {"collapsed": False, "gridPos": self.gridPos, "id": self.id, "panels": [],
                "title": self.title, "type": "row"}


@attr.s
class _CurrentType(_Current, core.Panel, ABC):
    """A panel type grafanalib emits in an old model or not at all: its `type`, field defaults
    and options in the current one."""

    panel_type: ClassVar[str]
    unit = attr.ib(default="s")

    @abstractmethod
    def field_defaults(self) -> dict[str, Any]:
        """`fieldConfig.defaults`."""

    @abstractmethod
    def options(self) -> dict[str, Any]:
        """The panel type's `options`."""

    def to_json_data(self) -> dict[str, Any]:
        return self.panel_json({
            "type": self.panel_type,
            "fieldConfig": {"defaults": self.field_defaults(), "overrides": []},
            "options": self.options(),
        })


@attr.s
class BucketHeatmap(_CurrentType):
    """The Grafana >= 9 heatmap over classic buckets: Prometheus already counted them."""

    panel_type = "heatmap"

    def field_defaults(self) -> dict[str, Any]:
        return {"custom": {"hideFrom": {"legend": False, "tooltip": False, "viz": False},
                           "scaleDistribution": {"type": "linear"}}}

    def options(self) -> dict[str, Any]:
        return {
            "calculate": False,
            "cellGap": 1,
            "color": {"exponent": 0.5, "fill": "dark-orange", "mode": "scheme", "reverse": False,
                      "scale": "exponential", "scheme": "Oranges", "steps": 64},
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
            "filterValues": {"le": 1e-9},
            "legend": {"show": True},
            "rowsFrame": {"layout": "auto"},
            "tooltip": {"mode": "single", "showColorScale": False, "yHistogram": True},
            "yAxis": {"axisPlacement": "left", "reverse": False, "unit": self.unit},
        }


@attr.s
class BarGauge(_CurrentType):
    """The current `bargauge` model (grafanalib's BarGauge still emits `fieldOptions`)."""

    panel_type = "bargauge"

    def field_defaults(self) -> dict[str, Any]:
        return {"color": {"mode": "thresholds"}, "min": 0, "unit": self.unit}

    def options(self) -> dict[str, Any]:
        return {"displayMode": "gradient", "orientation": "horizontal",
                "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                "showUnfilled": True, "valueMode": "color"}


@attr.s
class Variable(core.Template):
    """A datasource or `label_values` query variable in the current model."""

    def to_json_data(self) -> dict[str, Any]:
        if self.type == "datasource":
            return {"current": {}, "hide": 0, "includeAll": False, "label": self.label,
                    "multi": False, "name": self.name, "options": [], "query": self.query,
                    "refresh": 1, "regex": "", "skipUrlSync": False, "type": "datasource"}
        return {
            "allValue": ".*", "current": {"selected": True, "text": ["All"],
                                          "value": ["$__all"]},
            "datasource": DATASOURCE, "definition": self.query, "hide": 0, "includeAll": True,
            "label": self.label, "multi": True, "name": self.name, "options": [],
            "query": {"query": self.query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "refresh": 2, "regex": "", "skipUrlSync": False, "sort": 1, "type": "query",
        }


@attr.s
class Dashboard(core.Dashboard):
    """grafanalib's dashboard without the keys the current model removed."""

    def to_json_data(self) -> dict[str, Any]:
        data = super().to_json_data()
        for key in _LEGACY_DASHBOARD_KEYS:
            data.pop(key, None)
        return data
