"""The measured timeline goes through the same trace writer as the planned one, and the
plugin's own parser reads it; measured op times load as a cost-model calibration."""

from __future__ import annotations

import json
import logging
import re

import pytest

from rollplex.planner.cost_model import CALIBRATION_FORMAT, CostModel
from rollplex.runtime import measured_timeline, write_measured_calibration
from rollplex.specs import ScheduleSpec
from rollplex.trace import build_profiler_trace, diff_timelines, write_profiler_traces
from rollplex.trace.from_plan import plan_timeline
from tests.runtime.conftest import CPU, cached_run

pytest.importorskip("torch_tb_profiler", reason="torch-tb-profiler is not installed")
from torch_tb_profiler.profiler.data import RunProfileData
from torch_tb_profiler.profiler.run_generator import RunGenerator

pytestmark = pytest.mark.filterwarnings("ignore:The copy keyword is deprecated")
PLUGIN_FILE_RE = re.compile(r"^(.*?)(\.\d+)?\.pt\.trace\.json(\.gz)?$")


@pytest.fixture(scope="module")
def run():
    return cached_run(ScheduleSpec(name="rollplex", overlap="piggyback"))


def test_planned_and_measured_side_by_side_parse_cleanly(run, tmp_path, caplog):
    plan = run.planned.plan
    measured = measured_timeline(plan, run.results, device_name="cpu")
    planned = plan_timeline(plan, label="planned", steps=len(run.results))
    paths = write_profiler_traces(planned, tmp_path, worker_prefix="planned")
    paths += write_profiler_traces(measured, tmp_path, worker_prefix="measured")
    assert sorted(PLUGIN_FILE_RE.match(p.name).group(1) for p in paths) == [
        "measured0",
        "planned0",
    ]
    trace = json.loads(paths[-1].read_text())
    assert list(trace)[-1] == "traceEvents"
    with caplog.at_level(logging.WARNING, logger="pytorch_profiler"):
        data = RunProfileData.from_json("measured0", 1, trace)
        profile = RunGenerator("measured0", 1, data).generate_run_profile()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert data.steps_names == [str(k) for k in range(len(run.results))]
    ops = {r["name"]: r["calls"] for r in profile.operation_table_by_name["data"]}
    names = [m.step.name for r in run.results for m in r.steps]
    values = {n: ops.pop(n) for n in list(ops) if n in run.planned.graph.values}
    assert ops == {n: names.count(n) for n in set(names)}
    # resident before the first op: the weights, each named on a 1 ns op of its own
    assert {"policy.weights", "ref.weights"} <= values.keys()
    # The Memory view's curve peaks at the executor's own peak accounting.
    curve = profile.get_memory_curve(memory_metric="B")["rows"]["CPU"]  # a CPU run
    peak = max(max(r.peak_resident_bytes.values()) for r in run.results)
    assert max(row[1] for row in curve) == peak
    # Each measured span pairs with its planned span, step by step.
    diff = diff_timelines(planned, measured)
    assert not diff.unmatched_planned and not diff.unmatched_measured


def test_measured_times_calibrate_the_cost_model(run, tmp_path):
    path = tmp_path / "calibration.json"
    write_measured_calibration(path, "cpu", run.results, cost=lambda s: (1.0, 2.0))
    data = json.loads(path.read_text())
    assert data["format"] == CALIBRATION_FORMAT and data["entries"]
    kinds = {e["kind"] for e in data["entries"]}
    assert "decode" in kinds and "logprob_prefix" in kinds
    # Piggybacked steps are priced with their interference, not solo: left out.
    assert all(not e["op"].startswith("train.logprob_prefix") for e in data["entries"])
    base = CostModel(CPU)
    calibrated = base.calibrated(path)
    assert calibrated.eff("decode") != base.eff("decode")


def test_measured_memory_events_name_plan_steps_not_unknown(run):
    """Each byte the executor counts is an allocation inside the span of the step that
    made it resident, or, resident before any op (weights), of the value holding it, so
    the Memory view names that step or value (it named `<unknown>` when the events sat
    at step ends, outside every op)."""
    plan = run.planned.plan
    trace = build_profiler_trace(measured_timeline(plan, run.results), 0)
    data = RunProfileData.from_json("measured0", 1, json.loads(json.dumps(trace)))
    profile = RunGenerator("measured0", 1, data).generate_run_profile()
    allocated: dict[str, int] = {}
    for r in profile.memory_snapshot.memory_records:
        if r.bytes > 0:
            allocated[r.op_name_or_unknown] = allocated.get(r.op_name_or_unknown, 0) + r.bytes
    total = sum(allocated.values())
    names = {s.name for s in plan.all_steps()} | set(run.planned.graph.values)
    assert total > 0
    assert sum(b for n, b in allocated.items() if n in names) >= 0.95 * total, allocated


def test_an_op_faster_than_a_microsecond_still_writes_a_loadable_calibration(run, tmp_path):
    """A host-timed no-op can measure under the file format's 1 us floor; the writer records
    the floor (a GPU run's serial_dedup file was refused by the next run's planner)."""
    import dataclasses

    from rollplex.ops.calibration import load_calibration
    from rollplex.specs.calibration import MIN_S

    steps = [dataclasses.replace(m, end_s=m.start_s + 1e-9) for m in run.results[0].steps]
    fast = [dataclasses.replace(run.results[0], steps=steps)]
    path = tmp_path / "calibration.json"
    write_measured_calibration(path, "cpu", fast)
    entries = load_calibration(path).entries
    assert entries and all(e.measured_s == MIN_S for e in entries)


def test_a_kind_the_reader_would_refuse_is_left_out_with_a_warning(run, tmp_path, caplog):
    """Every run's calibration.json must load in the next run: a kind whose ratio is outside
    the file's bounds (here one op timed at a nanosecond against its predicted seconds) is
    left out, named in a warning; the other kinds stay, at their measured times."""
    import dataclasses

    from rollplex.ops.calibration import load_calibration

    steps = run.results[0].steps
    slow = max(steps, key=lambda m: m.step.solo_s)
    kept = [m for m in steps if m.step.kind != slow.step.kind]
    timed = [  # the slow op predicted at 0.5 s, over 1e4 x the 1 us its time is floored at
        dataclasses.replace(m, end_s=m.start_s + m.step.solo_s)
        if m is not slow
        else dataclasses.replace(m, step=dataclasses.replace(m.step, solo_s=0.5), end_s=m.start_s)
        for m in steps
    ]
    path = tmp_path / "calibration.json"
    with caplog.at_level(logging.WARNING, logger="rollplex.runtime.record"):
        write_measured_calibration(path, "cpu", [dataclasses.replace(run.results[0], steps=timed)])
    assert f"leaves out kind '{slow.step.kind}'" in caplog.text
    kinds = {e.kind for e in load_calibration(path).entries}
    assert slow.step.kind not in kinds and kinds >= {m.step.kind for m in kept if not m.note}
