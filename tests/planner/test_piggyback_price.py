"""A piggybacked chunk is priced for the one decode step it rides (as the torch engine runs
it: all its rows in that step's GEMMs): sharing one step's weight read hides little of a
chunk that is many steps' worth of compute, and part of one that is a fraction of a step.
Whatever it hides, the ride pays its own kernel launches and those of the decode step it
rides, which leaves the engine's graph: on an H100 a 3B training prefix chunk priced on its
compute alone at 1 ms measured 59-70 ms (bench/results/peers/h100_3b_easyvqa)."""

from __future__ import annotations

import pytest

from rollplex.jobs.pipeline import plan_step
from rollplex.planner.cost_model import FORWARD_KERNELS_PER_LAYER, CostModel
from rollplex.planner.plan import CoRun
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec

# 3B on one H200: 16 video prompts (the preset's 128 need 257 GiB there, every training
# micro-batch's saved inputs waiting for the backward)
VIDEO_16 = WORKLOAD_PRESETS["video"].model_copy(update={"prompts_per_step": 16})
CASES = [  # (model, workload, hardware, whether a chunk outweighs a decode step)
    ("qwen2_5_vl_3b", VIDEO_16, "h200", True),
    ("qwen2_5_vl_7b", "video", "h200x8", True),
    ("tiny", "tiny", "cpu", False),
]


@pytest.mark.parametrize(
    ("model", "workload", "hardware", "heavy"), CASES, ids=["3b-video16", "7b-video", "tiny"]
)
def test_a_ride_is_priced_for_the_step_it_rides(model, workload, hardware, heavy):
    args = (
        MODEL_PRESETS[model],
        WORKLOAD_PRESETS[workload] if isinstance(workload, str) else workload,
        AlgoSpec(),
        HARDWARE_PRESETS[hardware],
    )
    ride = plan_step(*args, ScheduleSpec(name="rollplex", overlap="piggyback")).plan
    # the prefix forward alone, run whole (in the trainer's micro-batches it would read
    # the weights once per micro-batch)
    serial = plan_step(*args, ScheduleSpec(name="serial", train_micro_tokens=1 << 30)).plan
    riders = [s for s in ride.all_steps() if s.corun is CoRun.PIGGYBACK]
    (alone,) = [s for s in serial.all_steps() if s.name == "train.logprob_prefix"]
    assert riders and all(s.op == alone.op for s in riders)
    priced = sum(s.solo_s for s in riders)
    launch = CostModel(HARDWARE_PRESETS[hardware]).launch_s
    eager = MODEL_PRESETS[model].num_layers * FORWARD_KERNELS_PER_LAYER * launch
    assert priced >= len(riders) * eager  # every ridden step leaves its graph
    if heavy:  # the whole compute, no less: one weight read shared out of many (and the
        # decode step's launch: the op alone launches once more)
        assert priced >= alone.solo_s - launch * (1 + 1e-9)
    else:  # a fraction of a step: some of its compute hides in the step's GEMMs, its
        # launches do not
        assert len(riders) == 1
        assert alone.solo_s < priced < alone.solo_s + eager
