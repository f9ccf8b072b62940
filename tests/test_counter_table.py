"""names.COUNTERS is the one place a counter is declared: a counter added to that table alone is
kept by the store, served on /metrics, taken by a push worker, carried and validated by the wire
format, merged by the aggregator and kept in its snapshot across a restart."""

from __future__ import annotations

import pytest

from exporter._internal import names
from exporter._internal.config.settings import AggregatorConfig, Config
from exporter._internal.expose.text import Renderer
from exporter._internal.fleet import wire
from exporter._internal.fleet.aggregator import Aggregator
from exporter._internal.fleet.take import take
from exporter._internal.record.recorder import Recorder

WIDGETS = names.Counter("llm_client_test_widgets_total", "Widgets a test counts, by colour.",
                        (names.MODEL, "colour"))


@pytest.fixture
def widgets(monkeypatch: pytest.MonkeyPatch) -> names.Counter:
    """The table with one counter more: an entry in names.COUNTERS, nothing else."""
    monkeypatch.setattr(names, "COUNTERS", (*names.COUNTERS, WIDGETS))
    monkeypatch.setattr(names, "COUNTERS_BY_NAME", {c.name: c for c in names.COUNTERS})
    return WIDGETS


def line(rec: Recorder, row: str) -> str:
    """The sample line of `row` on /metrics (the text format), or ""."""
    text = Renderer(rec).render().decode()
    return next((s for s in text.splitlines() if s.startswith(row + " ")), "")


def test_a_counter_added_to_the_table_is_served_pushed_merged_and_snapshotted(widgets, tmp_path):
    worker = Recorder()
    worker.locked(worker.add_row, widgets, ("m", "red"), 3)
    worker.locked(worker.add_row, widgets, ("m", "blue"), 1)
    row = 'llm_client_test_widgets_total{colour="red",model="m"}'
    assert line(worker, row) == f"{row} 3.0"
    assert "# TYPE llm_client_test_widgets_total counter" in Renderer(worker).render().decode()

    config = Config(aggregator=AggregatorConfig(snapshot_path=str(tmp_path / "state.snap")))
    target = Recorder(config)
    aggregator = Aggregator(config, target)
    delta = take(worker)
    delta.worker, delta.seq = "w1", 1
    assert delta.rows[widgets.name] == {("m", "red"): 3, ("m", "blue"): 1}
    body = wire.encode(delta, worker.schema.layouts())
    assert aggregator.accept(body)[0] == 200
    assert line(target, row) == f"{row} 3.0"
    assert not take(worker).rows[widgets.name]  # taken: zeros left behind

    aggregator.close()  # the last snapshot; a new aggregator restores it
    restored = Recorder(config)
    Aggregator(config, restored).close()
    assert line(restored, row) == f"{row} 3.0"
    assert line(restored, 'llm_client_test_widgets_total{colour="blue",model="m"}').endswith(
        " 1.0")


def test_an_unknown_value_of_a_closed_label_is_refused():
    worker = Recorder()
    worker.locked(worker.add_row, names.FINISH_REASONS_TOTAL, ("sometimes", "m", "p", "r"))
    delta = take(worker)
    delta.worker, delta.seq = "w1", 1
    status, answer = Aggregator(Config(), Recorder()).accept(
        wire.encode(delta, worker.schema.layouts()))
    assert status == 400 and "unknown label value" in answer["detail"]
