"""Defects seen in TensorBoard, checked on the exported JSON: ProfilerSteps of a repeated plan
equal and back to back (one was written 0.001 us shorter), a CPU run's lanes and memory
say CPU, a span's zero arguments show as 0, and the measured device is named as the plan
names it."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re

import pytest

from rollplex.runtime import measured_timeline
from rollplex.runtime.profile import device_label
from rollplex.specs import ScheduleSpec
from rollplex.trace import Span, Timeline, build_profiler_trace
from rollplex.trace.from_plan import plan_timeline
from tests.runtime.conftest import cached_run

pytest.importorskip("torch_tb_profiler", reason="torch-tb-profiler is not installed")
from torch_tb_profiler.profiler.data import RunProfileData
from torch_tb_profiler.profiler.run_generator import RunGenerator

pytestmark = pytest.mark.filterwarnings("ignore:The copy keyword is deprecated")


def _json(timeline: Timeline) -> dict:
    return json.loads(json.dumps(build_profiler_trace(timeline, 0)))


def _scaled(plan, seconds: float):
    """The plan stretched to a step of `seconds` (not a whole number of ns)."""
    f = seconds / plan.step_time_s
    devices = [
        dataclasses.replace(
            d,
            steps=[
                dataclasses.replace(s, start_s=s.start_s * f, end_s=s.end_s * f) for s in d.steps
            ],
        )
        for d in plan.devices
    ]
    return dataclasses.replace(plan, devices=devices, step_time_s=seconds)


@pytest.mark.parametrize("schedule", ["serial", "rollplex"])
@pytest.mark.parametrize("seconds", [3.43 + 1 / 3e7, 0.6700000001, 1 / 7])
@pytest.mark.parametrize("repeats", [2, 3])
def test_repeated_plan_steps_are_equal_and_back_to_back(schedule, seconds, repeats):
    plan = _scaled(cached_run(ScheduleSpec(name=schedule)).planned.plan, seconds)
    trace = _json(plan_timeline(plan, steps=repeats))
    steps = [
        (e["ts"], e["dur"]) for e in trace["traceEvents"] if e["name"].startswith("ProfilerStep#")
    ]
    durations = [d for _, d in steps]
    # equal to float error (the nesting trim), never the 0.001 us of a rounding
    assert len(steps) == repeats and max(durations) - min(durations) < 1e-6, steps
    for (a, d), (b, _) in itertools.pairwise(steps):
        assert a + d == pytest.approx(b, abs=1e-6)
    data = RunProfileData.from_json("planned0", 1, trace)
    profile = RunGenerator("planned0", 1, data).generate_run_profile()
    average = profile.overview["performance"][0]["value"]  # us, an int
    assert abs(average - seconds * 1e6) <= 1  # one step, not two


@pytest.mark.parametrize(
    ("device", "kind", "memory_type"), [("cpu", "CPU", 0), ("NVIDIA H200", "GPU", 1)]
)
def test_a_cpu_run_says_cpu_and_a_gpu_run_gpu(device, kind, memory_type):
    run = cached_run(ScheduleSpec(name="serial"))
    trace = _json(measured_timeline(run.planned.plan, run.results, device_name=device))
    names = {
        e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "process_name" and e["pid"] == 0
    }
    assert names == {f"{kind} 0"}
    memory = [e for e in trace["traceEvents"] if e["name"] == "[memory]"]
    assert memory and {e["args"]["Device Type"] for e in memory} == {memory_type}
    assert {p["name"] for p in trace["deviceProperties"]} == {device}
    assert trace["traceName"] == f"measured on {device} 0"  # the Trace view's title
    head = json.dumps(trace)[:4096]  # where rollplex.trace.offline's page looks for it
    assert re.search(r'"traceName":\s*"([^"]*)"', head).group(1) == trace["traceName"]


def test_zero_arguments_show_as_0_and_empty_ones_are_left_out():
    span = Span(0, 1, "op", 0.0, 5.0, args={"resident_bytes": 0, "solo_us": 0.0, "weights": ""})
    tl = Timeline("t", [span], [], [(0.0, 10.0)], {})
    (kernel,) = [e for e in _json(tl)["traceEvents"] if e.get("cat") == "kernel"]
    assert kernel["args"]["resident_bytes"] == "0" and kernel["args"]["solo_us"] == "0"
    assert "weights" not in kernel["args"]
    assert kernel["args"]["device"] == 0 and kernel["args"]["stream"] == 1  # ids stay ints


def test_a_measured_device_is_named_as_given_off_cuda():
    assert device_label("cpu") == "cpu"  # on CUDA: torch.cuda.get_device_name, as the plan


def test_the_host_process_does_not_repeat_the_device_lanes():
    """Each device span's host op is its 1 ns launch, not a copy of the device bar; the
    Operator view still gets each op's device time through the launch, and the Memory
    view still names the op that allocated."""
    run = cached_run(ScheduleSpec(name="serial"))
    trace = _json(measured_timeline(run.planned.plan, run.results, device_name="cpu"))
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    ops = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op" and "stream" in e["args"]]
    assert len(ops) == len(kernels) and max(e["dur"] for e in ops) <= 0.001
    assert sum(e["dur"] for e in kernels) > 1000 * sum(e["dur"] for e in ops)
    data = RunProfileData.from_json("measured0", 1, trace)
    profile = RunGenerator("measured0", 1, data).generate_run_profile()
    device = {r["name"]: r["device_self_duration"] for r in profile.operation_table_by_name["data"]}
    for name in {e["name"] for e in kernels}:
        want = sum(e["dur"] for e in kernels if e["name"] == name)
        assert device[name] == pytest.approx(want, abs=len(kernels))  # the plugin rounds to us
