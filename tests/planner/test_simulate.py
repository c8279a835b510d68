"""The replay: hand-built plans whose times follow from the interference model."""

from __future__ import annotations

import pytest

from rollplex.graph.ir import Graph, Op, Phase
from rollplex.jobs.pipeline import plan_step
from rollplex.planner.interference import InterferenceModel
from rollplex.planner.placement import PlanBuilder
from rollplex.planner.plan import CoRun, Plan
from rollplex.planner.simulate import replay, simulate
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, AlgoSpec, ScheduleSpec

from .conftest import VIDEO_16


def _two_streams(partition: float | None = None) -> Plan:
    pb = PlanBuilder("test", Graph(), "h")
    dev = pb.device("gpu", [0])
    a = pb.stream(dev, "decode", partition)
    b = pb.stream(dev, "prefix", None if partition is None else 1 - partition)
    pb.add(dev, a, Op("decode", "decode", Phase.ROLLOUT), 2.6, "bandwidth")
    pb.add(dev, b, Op("prefix", "logprob_prefix", Phase.TRAIN), 1.44, "compute")
    return pb.plan


def test_streams_match_the_measured_pair_rates() -> None:
    m = InterferenceModel()
    t = replay(_two_streams(), m)
    # FACTS.md: two plain streams are only 1.01x faster than serial.
    assert (2.6 + 1.44) / t == pytest.approx(1.01, abs=0.005)
    # The replay and the planner's closed-form fluid model agree.
    assert t == pytest.approx(2.6 + 1.44 - m.overlap_gain(CoRun.STREAMS, 2.6, 1.44))


def test_partition_keeps_each_side_confined() -> None:
    m = InterferenceModel()
    t = replay(_two_streams(partition=64 / 132), m)
    assert t > 2.6  # decode alone on 64 SMs is already 1.26x slower
    assert (2.6 + 1.44) / t < 1.05


def test_deadlock_is_reported() -> None:
    plan = _two_streams()
    plan.devices[0].steps[0].waits.append(99)
    with pytest.raises(RuntimeError, match="deadlocks"):
        replay(plan)


def test_cluster_scale_simulation_reports_every_stream() -> None:
    model = MODEL_PRESETS["qwen2_5_vl_32b"]
    work = VIDEO_16.model_copy(update={"prompts_per_step": 256})
    for tp in (4, 8):
        r = plan_step(
            model,
            work,
            AlgoSpec(),
            HARDWARE_PRESETS["h800x32"],
            ScheduleSpec(name="rollplex", parallel={"rollout_tp": tp}, train_micro_fused=True),
        )
        rep = simulate(r.plan)
        assert rep.gpus == 32
        assert r.plan.devices[0].tp == tp
        assert all(0.0 <= f <= 1.0 for f in rep.busy_fraction.values())
        assert rep.bubble_s["colocated"] >= 0
        assert rep.peak_bytes_per_gpu["colocated"] <= HARDWARE_PRESETS["h800x32"].hbm_bytes
