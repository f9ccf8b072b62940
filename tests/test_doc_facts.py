"""The numbers and sets the prose states are the ones the code defines.

`FACTS` is a small registry: each fact is computed from the code (a bucket count, the series a
histogram costs, the outcomes, the CLI's commands, a threshold a panel quotes) with the
phrasings the docs state it in. Every statement of a fact in the prose (and in the generated
dashboards' descriptions, which on-call reads) must be the code's value, and every fact must
still be stated somewhere: a phrasing no doc uses any more is removed, not left to check
nothing. A new statement of a number the code defines gets its phrasing here.

docs/decisions.md is left out: its entries record what was true when each was made.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import exporter
from exporter import cli
from exporter._internal import names
from exporter._internal.config.settings import Config
from exporter._internal.evidence.thresholds import DEFAULT

ROOT = Path(__file__).resolve().parent.parent
PROSE = sorted(p for p in (ROOT / "docs").rglob("*.md")
               if "reference" not in p.parts and p.name != "decisions.md") + [
    ROOT / "README.md", ROOT / "helm" / "ttft-exporter" / "README.md"]
DASHBOARDS = sorted((ROOT / "dashboards").rglob("*.json"))

WORDS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen twenty").split()
#: A number as the prose writes it: digits (thousands with commas) or a word.
NUM = rf"(?:\d{{1,3}}(?:,\d{{3}})+|\d+(?:\.\d+)?|{'|'.join(WORDS)})"


def number(text: str) -> float:
    text = text.lower().replace(",", "")
    return float(WORDS.index(text)) if text in WORDS else float(text)


def backticked(text: str) -> frozenset[str]:
    """The backticked words of an enumeration (`ttft-exporter serve` counts as `serve`)."""
    return frozenset(w.removeprefix("ttft-exporter ") for w in re.findall(r"`([^`]+)`", text))


@dataclass(frozen=True)
class Fact:
    name: str
    value: float | frozenset[str]
    #: Regexes, each with one group: the number (or the enumeration) as the prose states it.
    phrasings: tuple[str, ...]

    def stated(self, text: str) -> list[str]:
        return [m.group(1) for p in self.phrasings for m in re.finditer(p, text)]

    def holds(self, statement: str) -> bool:
        if isinstance(self.value, frozenset):
            return backticked(statement) == self.value
        return number(statement) == pytest.approx(self.value)


def subcommands() -> frozenset[str]:
    parser = cli.build_parser()
    [sub] = [a for a in parser._actions if a.choices and a.dest != "help"]
    return frozenset(sub.choices)


def facts() -> list[Fact]:
    config = Config()
    le = len(config.seconds_buckets()) + 1  # the finite bounds and +Inf
    histogram = le + 2  # `_bucket` per le, `_count`, `_sum`
    summary = len(config.window.quantiles) + 2
    #: The cost table's example: 3 models x 3 routes x max_tenants, each windowed family.
    windowed = 3 * 3 * config.labels.max_tenants
    # Native: 1 series, the SLO counts (threshold and +Inf) where the family has an objective.
    native = sum(1 + (2 if f in names.SLO_FAMILIES.values() else 0) + summary
                 for f in names.WINDOWED)
    per_call = sum(1 for f in names.HISTOGRAMS if f.per_call) + len(names.PHASES)
    return [
        Fact("`le` buckets of a seconds histogram", le, (rf"(~?{NUM}) `le`",)),
        Fact("classic series of one histogram", histogram,
             (rf"= ({NUM}) series", rf"~({NUM}) classic series")),
        Fact("series of a windowed family, classic", histogram + summary,
             (rf"\| in all \| ({NUM}) \|",)),
        Fact("window summary series", summary,
             (rf"\| window summary \| ({NUM}) \(",)),
        Fact("window quantiles", len(config.window.quantiles),
             (rf"\(({NUM}) quantiles, `_count`",)),
        Fact("Prometheus series of the cost example, classic",
             windowed * len(names.WINDOWED) * (histogram + summary),
             (rf"({NUM}) Prometheus series in classic mode",)),
        Fact("Prometheus series of the cost example, native", windowed * native,
             (rf"classic mode, ({NUM}) in native mode",)),
        Fact("native buckets per power of two", 2 ** config.histograms.native_schema,
             (rf"({NUM}) buckets per power of two",)),
        Fact("per-call values the recorder appends", per_call, (rf"({NUM}) per-call values",)),
        Fact("phases", len(names.PHASES), (rf"({NUM}) phases[;,)]",)),
        Fact("functions of the API", len(exporter.__all__),
             (rf"({NUM}) functions of the API",)),
        Fact("the API's functions", frozenset(exporter.__all__),
             (r"functions of the API: ([^)]*)\)",)),
        Fact("outcomes", frozenset(names.OUTCOMES), (r"the outcome \(([^)]*)\)",)),
        Fact("the CLI's commands", subcommands(),
             (r"(`ttft-exporter serve`(?:, `[a-z-]+`)+)",)),
        Fact("prefill surge factor (uncached input tokens)", DEFAULT.input_factor,
             (rf"Above ({NUM}) with the prefill phase up",)),
        Fact("noisy neighbour factor (largest stall)", DEFAULT.stall_factor,
             (rf"Above ({NUM}) for every route of a model",)),
    ]


FACTS = facts()


def texts() -> Iterable[tuple[str, str]]:
    for path in PROSE + DASHBOARDS:
        yield str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")


def test_every_fact_the_prose_states_is_the_codes():
    wrong = [f"{where}: {fact.name}: states {statement!r}, the code has {fact.value!r}"
             for where, text in texts() for fact in FACTS
             for statement in fact.stated(text) if not fact.holds(statement)]
    assert not wrong, "\n".join(wrong)


def test_every_fact_is_stated_somewhere():
    """A phrasing that matches nothing checks nothing: reword it with the doc, or drop it."""
    unstated = [fact.name for fact in FACTS
                if not any(fact.stated(text) for _, text in texts())]
    assert not unstated


# --- what a rule file holds, what a plain install deploys ---

def rule_kinds(path: Path) -> set[str]:
    """`record` and/or `alert`: the kinds of rule a committed rule file holds."""
    groups = yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
    return {kind for group in groups for rule in group["rules"] for kind in ("record", "alert")
            if kind in rule}


#: "`cause_rules.yaml`: what it holds" or "`cause_rules.yaml` (what it holds)".
RULE_FILE = re.compile(r"`(\w+_rules\.yaml)`(?::| \()([^;)]*)")
KIND_WORDS = {"record": r"\brecord(ing|ings|ed|s)?\b", "alert": r"\balert(s|ing)?\b|`LLM\w+`"}


def test_a_rule_file_is_described_by_the_kinds_of_rule_it_holds():
    wrong = []
    for where, text in texts():
        for name, described in RULE_FILE.findall(text):
            held = rule_kinds(ROOT / "alerts" / name)
            wrong += [f"{where}: {name} holds no {kind} rule: {described.strip()!r}"
                      for kind, words in KIND_WORDS.items()
                      if kind not in held and re.search(words, described)]
    assert not wrong, "\n".join(wrong)


def chart_off_by_default() -> dict[str, str]:
    """The chart's components off by default (`<key>.enabled: false`), by the word a doc
    names them with."""
    values = yaml.safe_load((ROOT / "helm" / "ttft-exporter" / "values.yaml").read_text())
    words = {"serviceMonitor": "ServiceMonitor", "watch": "ttft-exporter watch",
             "persistence": "persistence", "tls": "TLS"}
    off = {key for key, value in values.items()
           if isinstance(value, dict) and value.get("enabled") is False}
    assert off <= set(words), f"name the new optional component(s) {off - set(words)}"
    return {words[key]: key for key in off}


def test_a_plain_helm_install_is_not_said_to_deploy_what_is_off_by_default():
    """A sentence with `helm install ...` that names a component off by default also says how
    to turn it on (`--set <key>.enabled=true`)."""
    off = chart_off_by_default()
    wrong = []
    for where, text in texts():
        for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z`])|\n\s*\n|\n- ", text):
            if "`helm install" not in sentence:
                continue
            flat = " ".join(sentence.split())
            wrong += [f"{where}: {word}: {flat[:120]}..." for word, key in off.items()
                      if word in flat and f"{key}.enabled=true" not in flat
                      and not re.search(rf"off by default|optional|[Ww]ithout (the )?{word}",
                                        flat)]
    assert not wrong, "\n".join(wrong)
