"""Back-to-back ops share a lane even when their times come out of float sums; real
overlaps still go to overflow lanes; what is written nests under exact float comparison."""

from __future__ import annotations

import json
import logging

import pytest

from rollplex.trace import Span, Timeline, build_profiler_trace
from rollplex.trace._lanes import nesting_lanes, pack


def test_touching_within_float_error_is_not_an_overlap():
    end = 0.1 + 0.2  # 0.30000000000000004
    assert end > 0.3
    lanes, durs = pack([(0.1, end), (0.3, 0.5)])
    assert lanes == [0, 0]
    assert 0.1 + durs[0] <= 0.3  # the reader's own ts + dur nests exactly
    # A child that ends at its parent's end up to float error nests in it.
    lanes, durs = pack([(0.0, 0.3), (0.1, end)])
    assert lanes == [0, 0] and 0.1 + durs[1] <= 0.0 + durs[0]


def test_real_overlaps_still_get_their_own_lane():
    assert nesting_lanes([(0.0, 0.3), (0.2, 0.5)]) == [0, 1]
    assert nesting_lanes([(0.0, 0.3), (0.3 - 1e-6, 0.5)]) == [0, 1]  # 1 ps is time, not error
    assert pack([(0.0, 0.3), (0.2, 0.5)])[1] == [0.3, 0.3]  # nothing trimmed


def test_back_to_back_planned_ops_draw_on_one_lane(caplog):
    pytest.importorskip("torch_tb_profiler", reason="torch-tb-profiler is not installed")
    from torch_tb_profiler.profiler.data import RunProfileData

    # Times in us as the planner adds them up: 0.1 + 0.2 lands past 0.3 by float error.
    spans = [Span(0, 0, "a", 0.1, 0.2), Span(0, 0, "b", 0.3, 0.4), Span(0, 0, "c", 0.7, 0.1)]
    tl = Timeline("planned", spans, [], [(0.0, 1.0)], {(0, 0): "compute"})
    trace = json.loads(json.dumps(build_profiler_trace(tl, 0)))
    names = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"]
    assert not [n for n in names if "[overlap" in n], names
    with caplog.at_level(logging.WARNING, logger="pytorch_profiler"):
        RunProfileData.from_json("planned0", 1, trace)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
