"""Planned vs measured comparison."""

from __future__ import annotations

import math
from collections.abc import Callable

from rollplex.trace import DiffRow, Span, Timeline, diff_timelines


def _tl(*spans: Span) -> Timeline:
    return Timeline("t", list(spans), [], [], {})


def test_pairs_by_device_name_and_occurrence(timeline_factory: Callable[..., Timeline]) -> None:
    planned, measured = timeline_factory("planned"), timeline_factory("measured", skew=1.25)
    diff = diff_timelines(planned, measured)
    assert len(diff.rows) == len(planned.spans)
    assert not diff.unmatched_planned and not diff.unmatched_measured
    for row in diff.rows:
        assert row.ratio == (1.25 if row.device == 1 and row.name != "reward" else 1.0)
    decode0 = [r for r in diff.rows if (r.device, r.name) == (0, "decode")]
    assert [r.occurrence for r in decode0] == list(range(8))  # 4 chunks x 2 steps


def test_kth_planned_pairs_with_kth_measured_in_time_order() -> None:
    planned = _tl(Span(0, 1, "mm", 100, 10), Span(0, 1, "mm", 0, 20))
    measured = _tl(Span(0, 2, "mm", 5, 40), Span(0, 2, "mm", 200, 30))
    rows = diff_timelines(planned, measured).rows
    assert [(r.planned_us, r.measured_us) for r in rows] == [(20, 40), (10, 30)]
    assert [r.ratio for r in rows] == [2.0, 3.0]


def test_unmatched_spans_are_listed_not_dropped() -> None:
    planned = _tl(Span(0, 0, "a", 0, 10), Span(0, 0, "a", 10, 10), Span(1, 0, "a", 0, 10))
    measured = _tl(Span(0, 0, "a", 0, 12), Span(0, 0, "b", 20, 5))
    diff = diff_timelines(planned, measured)
    assert [(r.device, r.name, r.occurrence) for r in diff.rows] == [(0, "a", 0)]
    assert sorted((s.device, s.start_us) for s in diff.unmatched_planned) == [(0, 10), (1, 0)]
    assert [s.name for s in diff.unmatched_measured] == ["b"]
    md = diff.markdown()
    assert "Only planned (2):" in md and "Only measured (1):" in md
    assert "device 0 stream 0: b" in md


def test_aggregate_sums_pairs_per_key() -> None:
    planned = _tl(Span(0, 0, "a", 0, 10), Span(0, 0, "a", 10, 30), Span(0, 0, "a", 50, 1))
    measured = _tl(Span(0, 0, "a", 0, 20), Span(0, 0, "a", 30, 40))
    diff = diff_timelines(planned, measured, aggregate=True)
    assert [(r.occurrence, r.planned_us, r.measured_us) for r in diff.rows] == [(-1, 40, 60)]
    assert len(diff.unmatched_planned) == 1
    assert "| 0 | a | all | 40.0 | 60.0 | 1.500 |" in diff.markdown()


def test_ratio_edge_cases() -> None:
    assert DiffRow(0, "x", 0, 0.0, 5.0).ratio == math.inf
    assert DiffRow(0, "x", 0, 0.0, 0.0).ratio == 1.0
    assert DiffRow(0, "x", 0, 4.0, 1.0).ratio == 0.25


def test_markdown_escapes_pipes_and_has_one_line_per_row() -> None:
    diff = diff_timelines(_tl(Span(0, 0, "a|b", 0, 10)), _tl(Span(0, 0, "a|b", 0, 15)))
    lines = diff.markdown().splitlines()
    assert len(lines) == 2 + len(diff.rows)
    assert "a\\|b" in lines[-1] and lines[-1].endswith("| 1.500 |")
