"""vLLM sharing the trainer's storage (`backend.vllm.weights=share`, VLLM_SHARED_ROLLOUT) is
planned with no second copy: its weight sync stays an alias, the rollout-copy slots are
empty, and the peak is the own-copy engine's (kept awake) less exactly that copy, on every
preset x workload x schedule tried."""

from __future__ import annotations

import pytest

from rollplex.jobs.pipeline import plan_step
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec
from rollplex.specs.roles import VLLM_ROLLOUT, VLLM_SHARED_ROLLOUT

from .conftest import VIDEO_16


def _plan(model: str, workload: str, schedule: str, caps, sleep: bool | None):
    hardware = HARDWARE_PRESETS["cpu" if model == "tiny" else "h200"]
    return plan_step(
        MODEL_PRESETS[model],
        # the video preset's 128 prompts need 257 GiB on one GPU at 3B (every training
        # micro-batch's saved inputs wait for the backward): 16 prompts
        VIDEO_16 if workload == "video" else WORKLOAD_PRESETS[workload],
        AlgoSpec(),
        hardware,
        ScheduleSpec(name=schedule),
        rollout=caps,
        engine_sleep=sleep,
    )


@pytest.mark.parametrize("schedule", ["serial", "rollplex"])
@pytest.mark.parametrize("workload", ["tiny", "video"])
@pytest.mark.parametrize("model", ["tiny", "qwen2_5_vl_3b"])
def test_a_sharing_engine_is_charged_no_copy(model, workload, schedule):
    own = _plan(model, workload, schedule, VLLM_ROLLOUT, sleep=False)
    shared = _plan(model, workload, schedule, VLLM_SHARED_ROLLOUT, sleep=None)
    modes = {op.attrs["mode"] for op in shared.graph.ops.values() if op.kind == "weight_sync"}
    assert modes == {"alias"}
    (gen,) = [op for op in shared.graph.ops.values() if op.kind == "generate"]
    assert gen.meta["own_weights"] is False and gen.meta["sleep_levels"] == []
    (dev,) = shared.plan.devices
    assert all(s.size == 0 for s in dev.slots if s.value_kind == "rollout_weights")
    (own_dev,) = own.plan.devices
    copy = sum(s.size for s in own_dev.slots if s.value_kind == "rollout_weights")
    assert copy > 0
    saved = own.plan.peak_bytes_per_gpu - shared.plan.peak_bytes_per_gpu
    assert abs(saved - copy) <= 0.01 * copy, (saved, copy)
    assert shared.plan.step_time_s <= own.plan.step_time_s  # no load into the engine
