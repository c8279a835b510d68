"""A torch.profiler run of plan steps, exported beside the planned trace of the same run:
two workers of one TensorBoard run with the same step names, memory named by plan step,
and a planned-vs-measured table per step."""

from __future__ import annotations

import logging
import re
from collections import Counter

import pytest

from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.runtime.profile import TABLE, export_run, load_trace, step_profiler
from rollplex.specs import ScheduleSpec
from tests.runtime.conftest import ALGO, CPU, MODEL, WORKLOAD

pytest.importorskip("torch_tb_profiler", reason="torch-tb-profiler is not installed")
from torch_tb_profiler.profiler.data import RunProfileData
from torch_tb_profiler.profiler.run_generator import RunGenerator

pytestmark = pytest.mark.filterwarnings("ignore:The copy keyword is deprecated")
PLUGIN_FILE_RE = re.compile(r"^(.*?)(\.\d+)?\.pt\.trace\.json(\.gz)?$")


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    planned = plan_step(
        MODEL, WORKLOAD, ALGO, CPU, ScheduleSpec(name="rollplex", overlap="piggyback")
    )
    backend = compose(StepConfig(MODEL, ALGO, seed=0, max_new_tokens=4))
    ex = Executor(planned.plan, planned.graph, backend)
    data = TaskData(MODEL, WORKLOAD, seed=0)
    ex.run_step(0, data.step(0))  # warm-up, outside the profile
    prof = step_profiler("cpu")
    with prof:
        results = [ex.run_step(k, data.step(k)) for k in (1, 2)]
    run = tmp_path_factory.mktemp("profiled") / "run"  # alone in its folder: the server's logdir
    run.mkdir()
    paths = export_run(run, planned.plan, results, prof, device_name="cpu")
    return planned.plan, results, run, paths


def _parse(path, caplog):
    trace = load_trace(path)
    with caplog.at_level(logging.ERROR, logger="pytorch_profiler"):
        data = RunProfileData.from_json(path.name, 1, trace)
        profile = RunGenerator(path.name, 1, data).generate_run_profile()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    return trace, data, profile


def test_two_workers_of_one_run_with_the_same_step_names(profiled, caplog):
    plan, _, run, paths = profiled
    traces = {PLUGIN_FILE_RE.match(p.name).group(1): p for p in paths if p.name != TABLE}
    assert sorted(traces) == ["measured0", "planned0"]
    assert sorted(p.name for p in run.iterdir()) == sorted(p.name for p in paths)  # no temp
    names = {s.name for s in plan.all_steps()}
    ops = {}
    for worker, path in traces.items():
        trace, data, profile = _parse(path, caplog)
        assert list(trace)[-1] == "traceEvents"
        assert data.steps_names == ["1", "2"]  # both workers: the RL steps measured
        ops[worker] = {r["name"]: r["calls"] for r in profile.operation_table_by_name["data"]}
    assert {n: ops["measured0"][n] for n in names} == {n: 2 for n in names}
    # and the planned one the plan steps, plus a 1 ns op per value resident all along
    values = {sl.value for d in plan.devices for sl in d.slots}
    planned = {n: c for n, c in ops["planned0"].items() if n not in values}
    assert planned == {n: 2 for n in names}
    # The measured worker holds the real work under the steps: aten ops from the profiler.
    assert {"aten::mm", "aten::addmm"} & set(ops["measured0"])


def test_measured_memory_is_named_by_plan_step(profiled, caplog):
    plan, _, _, paths = profiled
    _, _, profile = _parse(next(p for p in paths if p.name.startswith("measured0")), caplog)
    allocated = Counter()
    for r in profile.memory_snapshot.memory_records:
        if r.bytes > 0:
            allocated[r.op_name_or_unknown] += r.bytes
    total = sum(allocated.values())
    names = {s.name for s in plan.all_steps()}
    assert total > 1 << 20  # real allocations were recorded
    assert sum(b for n, b in allocated.items() if n in names) >= 0.9 * total, allocated
    assert allocated["<unknown>"] < 0.05 * total
    # The Memory view's events table shows the same names.
    rows = [row for rows in profile.get_memory_events()["rows"].values() for row in rows]
    assert {row[0] for row in rows} & names


def test_the_table_has_a_row_per_plan_step(profiled):
    plan, results, run, _ = profiled
    text = (run / TABLE).read_text()
    rows = [line.split("|")[1:-1] for line in text.splitlines() if re.match(r"\| \d", line)]
    assert [(int(r[0]), r[1].strip()) for r in rows] == [
        (s.index, s.name) for s in plan.all_steps()
    ]
    for r, s in zip(rows, plan.all_steps(), strict=True):
        assert r[2].strip() == s.kind
        assert float(r[4]) == pytest.approx((s.end_s - s.start_s) * 1e3, abs=1e-3)
        ms = sorted(m.seconds for res in results for m in res.steps if m.step.index == s.index)
        assert float(r[5]) == pytest.approx((ms[0] + ms[1]) / 2 * 1e3, abs=1e-3)


@pytest.mark.slow  # ~20 s: a real server; the in-process parser tests above cover the claim
def test_a_real_tensorboard_serves_both_workers_with_memory_by_step(profiled, tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is not installed")
    from tests.tensorboard_server import API, tensorboard

    plan, _, run, _ = profiled
    names = {s.name for s in plan.all_steps()}
    with tensorboard(run.parent, run.name, tmp_path / "tb.log") as srv:
        assert srv.get(API + "workers", run=run.name, view="Memory") == ["measured0", "planned0"]
        q = {"run": run.name, "worker": "measured0", "span": 1}
        trace = srv.get(API + "trace", **q)["traceEvents"]
        assert names <= {e["name"] for e in trace if e.get("cat") == "cpu_op"}
        events = srv.get(API + "memory_events", memory_metric="B", **q)["rows"]
        rows = [row for device_rows in events.values() for row in device_rows]
        by_name: dict[str, float] = {}
        for row in rows:
            by_name[row[0]] = by_name.get(row[0], 0) + row[1]
        outside = {n: b for n, b in by_name.items() if n not in names}
        assert sum(outside.values()) <= 0.1 * sum(by_name.values()), outside
