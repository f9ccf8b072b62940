"""`ttft-exporter generate`: dashboards/*.json and alerts/*.yaml from one config.

Output is deterministic (sorted keys, fixed uids, 2-space indent, trailing newline) so the
committed files are exactly the defaults' output and a test can regenerate and diff them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from grafanalib._gen import DashboardEncoder

from . import alerts, dashboards
from .config import Config

#: The Helm chart carries copies (Helm reads files only inside the chart): written too when the
#: output directory holds the chart, so one command keeps all three in step.
CHART_FILES = Path("helm", "ttft-exporter", "files")
RECORDING_FILE = "recording_rules.yaml"
ALERTING_FILE = "alerting_rules.yaml"
YAML_HEADER = (f"# {alerts.GENERATED_BY[0].upper()}{alerts.GENERATED_BY[1:]}.\n"
               "# Regenerate with `ttft-exporter generate [--config FILE] [--out DIR]`.\n")


class _RulesDumper(yaml.SafeDumper):
    """Block style with indented lists, and PromQL/templates over several lines as `|` blocks."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_RulesDumper.add_representer(str, _str)


def rules_yaml(groups: list[dict[str, Any]]) -> str:
    body = yaml.dump({"groups": groups}, Dumper=_RulesDumper, sort_keys=True, indent=2,
                     width=1 << 16, allow_unicode=True, default_flow_style=False)
    return YAML_HEADER + body


def dashboard_json(dashboard: dashboards.Dashboard) -> str:
    return json.dumps(dashboard.to_json_data(), cls=DashboardEncoder, sort_keys=True, indent=2,
                      ensure_ascii=False) + "\n"


def generate(config: Config, out_dir: Path) -> list[Path]:
    """Write every dashboard and rule file under `out_dir`; return the paths written, sorted."""
    files: dict[Path, str] = {
        Path("alerts", RECORDING_FILE): rules_yaml(alerts.recording_rules(config)),
        Path("alerts", ALERTING_FILE): rules_yaml(alerts.alerting_rules(config)),
    }
    for uid, dashboard in dashboards.dashboards(config).items():
        files[Path("dashboards", f"{uid}.json")] = dashboard_json(dashboard)
    if (Path(out_dir) / CHART_FILES).parent.is_dir():
        files.update({CHART_FILES / relative: text for relative, text in list(files.items())})
    written = []
    for relative, text in sorted(files.items()):
        path = Path(out_dir) / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written

