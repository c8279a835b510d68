"""A planned run, as `rollplex plan` writes it, loads in TensorBoard's profiler plugin."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollplex.jobs import run_job
from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    AlgoSpec,
    ScheduleSpec,
)
from rollplex.specs.run import RunSpec
from tests.planner.conftest import VIDEO_16
from tests.tensorboard_server import API, tensorboard

pytest.importorskip("torch_tb_profiler", reason="torch-tb-profiler is not installed")


def test_planned_run_serves_runs_trace_and_memory_curve(tmp_path: Path) -> None:
    spec = RunSpec(
        job="plan",
        model=MODEL_PRESETS["qwen2_5_vl_7b"],
        algo=AlgoSpec(),
        workload=VIDEO_16,
        schedule=ScheduleSpec(name="rollplex", overlap="piggyback"),  # decode segments
        hardware=HARDWARE_PRESETS["h200x8"],
    )
    summary = run_job(spec, tmp_path / "run")
    with tensorboard(tmp_path, "run/tb", tmp_path / "tb.log") as srv:
        trace = srv.get(API + "trace", run="run/tb", worker="planned0", span=1)
        kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
        names = {e["name"] for e in kernels}
        assert any(n.startswith("rollout.decode#") for n in names)
        assert any(e["args"].get("corun") == "piggyback" for e in kernels)
        curve = srv.get(
            API + "memory_curve", run="run/tb", worker="planned0", span=1, memory_metric="B"
        )
        live = max(r[1] for r in curve["rows"]["GPU0"])
        # The curve is bytes allocated (live slots); the arenas reserve the planned peak.
        assert live == summary["lower_bound_bytes"] <= summary["peak_bytes_per_gpu"]
