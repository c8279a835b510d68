"""Decode is priced by the step's longest response: a synchronous step waits for the
longest of all its samples (every replica), so at a fixed batch per GPU the predicted
decode never shortens as GPUs are added, and it reaches the generation cap once the step
holds enough samples for its tail to get there."""

from __future__ import annotations

import itertools

import pytest

from rollplex.algos import build_step
from rollplex.ops import formulas as F
from rollplex.ops.costs import CostContext, op_cost
from rollplex.ops.rollout_costs import decode_steps
from rollplex.planner.cost_model import CostModel
from rollplex.planner.layout import OpTimer, RoleLayout
from rollplex.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    WORKLOAD_PRESETS,
    AlgoSpec,
    ResponseLengthSpec,
    WorkloadSpec,
)

GPUS = (8, 32, 128, 512, 2048)
LENGTHS = {
    "lognormal": ResponseLengthSpec(distribution="lognormal", mean=256, max=1024, sigma=0.6),
    "uniform": ResponseLengthSpec(distribution="uniform", mean=256, min=16, max=1024),
    "fixed": ResponseLengthSpec(distribution="fixed", mean=256, max=256),
}


def _decode_at(model: str, workload: str, lengths: str, gpus: int, per_gpu: int, tp: int):
    """(steps, decode op's solo seconds) of one replica when the step holds `per_gpu`
    prompts per GPU on `gpus` GPUs, rollout at `tp`."""
    spec = MODEL_PRESETS[model]
    w: WorkloadSpec = WORKLOAD_PRESETS[workload].model_copy(
        update={"prompts_per_step": per_gpu * gpus, "response_length": LENGTHS[lengths]}
    )
    graph = build_step(spec, w, AlgoSpec())
    op = next(o for o in graph if o.kind == "decode")
    ctx = CostContext(spec, w, tp=tp, dp=gpus // tp)
    hw = HARDWARE_PRESETS["h800x32"].model_copy(update={"num_gpus": gpus})
    timer = OpTimer(
        graph, spec, w, hw, CostModel(hw), rollout=RoleLayout(gpus, tp), train=RoleLayout(gpus)
    )
    return decode_steps(graph, op, ctx), timer.time(op).seconds, op_cost(graph, op, ctx)


@pytest.mark.parametrize(
    ("model", "workload", "tp", "per_gpu"),
    [("qwen2_5_vl_72b", "video", 8, 1), ("qwen2_5_vl_7b", "image", 1, 2), ("tiny", "tiny", 1, 1)],
)
@pytest.mark.parametrize("lengths", sorted(LENGTHS))
def test_decode_never_shortens_as_gpus_grow(model, workload, tp, per_gpu, lengths):
    runs = [_decode_at(model, workload, lengths, n, per_gpu, tp) for n in GPUS]
    for (s0, t0, c0), (s1, t1, c1) in itertools.pairwise(runs):
        assert s0 <= s1
        assert t0 <= t1 * (1 + 1e-9)  # the same rows a replica, more steps
        assert c0.weight_bytes <= c1.weight_bytes  # one weight read per step
    cap = LENGTHS[lengths].max
    assert all(s <= cap - 1 for s, _, _ in runs)  # token 0 comes from the prefill
    if lengths == "fixed":
        assert {s for s, _, _ in runs} == {cap - 1}


@pytest.mark.parametrize(("model", "tp"), [("qwen2_5_vl_72b", 8), ("qwen2_5_vl_7b", 1)])
def test_a_large_step_decodes_to_the_cap(model, tp):
    """The audit's case: 72B at TP 8 on 128 and 2,048 GPUs, 1,024 samples and more: the
    longest of them reaches the 1,024-token cap (the heavy lognormal tail), so every replica
    waits out the cap, whatever its own rows."""
    for gpus in (128, 2048):
        steps, _, _ = _decode_at(model, "video", "lognormal", gpus, 1, tp)
        assert steps == LENGTHS["lognormal"].max - 1


def test_one_replica_is_unchanged_and_the_floor_is_one_row():
    """With every sample on one replica the step's longest is that replica's: the formula's
    own steps. Each step runs at least one row (the sequence that sets the length)."""
    w = WORKLOAD_PRESETS["image"].model_copy(update={"response_length": LENGTHS["lognormal"]})
    m = MODEL_PRESETS["qwen2_5_vl_7b"]
    alone = F.decode_rollout(m, w, prompts=2, group_size=4)
    assert alone == F.decode_rollout(m, w, prompts=2, group_size=4, step_samples=8)
    assert alone.steps == F.decode_steps(w, 8)
    wide = F.decode_rollout(m, w, prompts=2, group_size=4, step_samples=8 * 512)
    assert wide.steps > alone.steps
    # The extra steps each read the weights and run at least one row.
    extra = wide.steps - alone.steps
    one_row = F.decode_step(m, 1, w.prefix_tokens(m.vision))
    assert wide.cost.flops - alone.cost.flops >= extra * one_row.flops * 0.99
    # Tokens stay this replica's expected ones: the longer run only adds the tail it cut.
    assert alone.generated_tokens <= wide.generated_tokens <= 8 * w.response_length.mean * 1.01


@pytest.mark.parametrize("lengths", sorted(LENGTHS))
def test_the_same_step_on_more_gpus_decodes_as_long(lengths):
    """A fixed step (2,048 prompts) spread over more replicas: each holds fewer rows, but
    the step still waits for the same longest response."""
    runs = [_decode_at("qwen2_5_vl_72b", "video", lengths, n, 2048 // n, 8) for n in GPUS]
    assert len({s for s, _, _ in runs}) == 1
