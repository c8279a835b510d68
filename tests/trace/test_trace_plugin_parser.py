"""Our traces through torch-tb-profiler's own parser, in process (no server)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import pytest

from rollplex.trace import Timeline, build_profiler_trace

pytest.importorskip("torch_tb_profiler", reason="torch-tb-profiler is not installed")
from torch_tb_profiler.profiler.data import RunProfileData
from torch_tb_profiler.profiler.event_parser import ProfileRole
from torch_tb_profiler.profiler.run_generator import RunGenerator

# The plugin's kernel parser passes pandas a keyword that pandas 3 deprecates; not ours.
pytestmark = pytest.mark.filterwarnings("ignore:The copy keyword is deprecated")


def _profile(timeline: Timeline, device: int):
    trace = json.loads(json.dumps(build_profiler_trace(timeline, device)))
    data = RunProfileData.from_json(f"gpu{device}", 1, trace)
    return data, RunGenerator(f"gpu{device}", 1, data).generate_run_profile()


@pytest.mark.parametrize("device", [0, 1])
def test_plugin_parses_every_view_without_complaint(
    timeline: Timeline, device: int, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="pytorch_profiler"):
        data, profile = _profile(timeline, device)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []

    views = [v.display_name for v in profile.views]
    assert {"Overview", "Operator", "Kernel", "Trace", "Memory"} <= set(views)
    assert data.used_devices == [device]

    # Steps keep their own boundaries (no kernel is counted in a neighbouring step).
    assert data.steps_names == ["0", "1"]
    totals = [c.costs[ProfileRole.Total] for c in data.steps_costs]
    assert totals == [pytest.approx(end - start) for start, end in timeline.steps]
    assert len(profile.overview["steps"]["rows"]) == len(timeline.steps)

    # Every span is an operator (with its device time) and every kernel is a kernel.
    ops = {r["name"]: r for r in profile.operation_table_by_name["data"]}
    spans = [s for s in timeline.spans if s.device == device]
    for name in {s.name for s in spans}:
        total = sum(s.dur_us for s in spans if s.name == name)
        device_total = total if any(s.cat == "kernel" for s in spans if s.name == name) else 0
        assert ops[name]["calls"] == sum(s.name == name for s in spans)
        assert ops[name]["device_total_duration"] == pytest.approx(device_total)
    kernels = {row[0] for row in profile.kernel_table["data"]["rows"]}
    assert kernels == {s.name for s in spans if s.cat == "kernel"}

    # Memory: the curve peaks at our peak, and named allocations are attributed to their op.
    mem = [m for m in timeline.memory if m.device == device]
    curve = profile.get_memory_curve(memory_metric="B")
    assert curve["metadata"]["devices"] == [f"GPU{device}"]
    assert max(row[1] for row in curve["rows"][f"GPU{device}"]) == max(
        m.total_allocated for m in mem
    )
    rows = profile.get_memory_events(memory_metric="B")["rows"][f"GPU{device}"]
    assert {r[0] for r in rows} == {m.name for m in mem if m.delta_bytes > 0}
    summary = {d["title"]: d["value"] for d in profile.gpu_summary}
    assert summary["Name"] == timeline.device_name


def test_spans_crossing_on_one_stream_are_all_kept(
    timeline_factory: Callable[..., Timeline], caplog: pytest.LogCaptureFixture
) -> None:
    # Stretching durations but not starts makes decode chunks (and backward/optimizer_step)
    # cross each other on their stream, as clock skew in a measured timeline can.
    timeline = timeline_factory("measured", skew=1.07)
    with caplog.at_level(logging.WARNING, logger="pytorch_profiler"):
        _, profile = _profile(timeline, 1)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    calls = {r["name"]: r["calls"] for r in profile.operation_table_by_name["data"]}
    spans = [s for s in timeline.spans if s.device == 1]
    assert calls == {n: sum(s.name == n for s in spans) for n in {s.name for s in spans}}
