"""The planner plans only what the rollout role can do (planner/capabilities.py)."""

from __future__ import annotations

import pytest

from rollplex.algos import build_step
from rollplex.backends.torch.roles import TorchRollout
from rollplex.graph.ir import Phase
from rollplex.jobs.pipeline import plan_step
from rollplex.planner.capabilities import apply_rollout_capabilities
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec
from rollplex.specs.roles import VLLM_ROLLOUT

MODEL, WORKLOAD = MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"]
CPU, H200 = HARDWARE_PRESETS["cpu"], HARDWARE_PRESETS["h200"]
ENGINE = VLLM_ROLLOUT  # what the vLLM rollout declares (no vLLM import needed)
TORCH = TorchRollout.capabilities


def _steps(caps, overlap: str, hardware=CPU, name: str = "rollplex"):
    planned = plan_step(
        MODEL,
        WORKLOAD,
        AlgoSpec(),
        hardware,
        ScheduleSpec(name=name, overlap=overlap),
        rollout=caps,
    )
    return planned, [s for d in planned.plan.devices for s in d.steps]


def test_torch_rollout_may_host_piggybacked_rows_and_prefills_apart():
    _, steps = _steps(TORCH, "piggyback")
    assert any(s.kind == "prefix_prefill" and s.phase == "rollout" for s in steps)
    assert any(s.corun.value == "piggyback" for s in steps)


def test_auto_tries_the_ride_and_keeps_it_only_where_it_is_faster():
    """The tiny step's ride costs its launches and an eager decode step, more than the
    prefix forward it hides: auto tries it and runs the prefix where it is read."""
    forced, _ = _steps(TORCH, "piggyback")
    auto, steps = _steps(TORCH, "auto")
    assert any(n.startswith("train.logprob_prefix: serial") for n in auto.plan.notes)
    assert not any(s.corun.value == "piggyback" for s in steps)
    assert auto.plan.step_time_s < forced.plan.step_time_s


@pytest.mark.parametrize("overlap", ["piggyback", "streams", "auto"])
def test_engine_rollout_gets_one_generate_op_and_no_piggyback(overlap):
    planned, steps = _steps(ENGINE, overlap)
    rollout = [s for s in steps if s.phase == "rollout" and s.kind != "reward"]
    assert {s.kind for s in rollout} <= {"generate", "advantage"}
    assert not any(s.kind == "prefix_prefill" for s in steps)
    assert not any(s.corun.value == "piggyback" for s in steps)
    gen = planned.graph.ops[next(s.op for s in steps if s.kind == "generate")]
    assert set(gen.inputs) == {"pixels", "text", "weights", "vision_weights"}
    assert gen.meta["piggyback_rows"] is False


def test_reference_and_training_prefix_still_overlap_the_engine_decode():
    _, steps = _steps(ENGINE, "streams")
    side = [s for s in steps if s.corun.value == "streams"]
    assert {s.phase for s in side} == {"reference", "train"}
    assert {"vision_encode", "logprob_prefix"} <= {s.kind for s in side}


def test_engine_weight_sync_is_a_priced_copy_not_a_free_alias():
    torch_plan, _ = _steps(TORCH, "none", H200, "serial")
    engine_plan, _ = _steps(ENGINE, "none", H200, "serial")

    def sync(p):
        return next(s for d in p.plan.devices for s in d.steps if s.kind == "weight_sync")

    assert p_mode(torch_plan) == "alias" and p_mode(engine_plan) == "load"
    # alias: only the copy's fixed latency; load: every byte of the weights on top
    assert sync(engine_plan).solo_s > sync(torch_plan).solo_s


def p_mode(planned) -> str:
    return next(op.attrs["mode"] for op in planned.graph if op.kind == "weight_sync")


def test_the_pass_leaves_a_torch_graph_alone_apart_from_the_flag():
    graph = build_step(MODEL, WORKLOAD, AlgoSpec())
    out, _ = apply_rollout_capabilities(graph, TORCH)
    assert [(op.name, op.kind) for op in out] == [(op.name, op.kind) for op in graph]
    fused, changed = apply_rollout_capabilities(graph, ENGINE)
    assert changed and len(fused) == len(graph) - 2  # vision + prefill folded in
    assert not any(op.phase is Phase.ROLLOUT and op.kind == "vision_encode" for op in fused)


def _grads(graph) -> list[str]:
    return [graph.values[op.outputs["grads"]].dtype for op in graph if op.kind == "backward"]


@pytest.mark.parametrize("trainer, want", [("torch", "bfloat16"), ("fsdp", "float32")])
def test_the_trainer_sets_the_gradients_dtype_and_the_steps_cast(trainer, want):
    """The torch trainer's backward leaves bf16 gradients (autograd's, on bf16 parameters)
    and its step casts them onto the float32 masters a chunk at a time: the largest
    tensor's float32 cast (the embedding, while the norm is taken) at the step, not 2 more
    bytes for every parameter; FSDP2's float32 shards get float32 gradients and the step
    casts nothing."""
    from rollplex.backends import trainer_capabilities
    from rollplex.ops.costs import CostContext, op_cost
    from rollplex.planner.capabilities import apply_trainer_capabilities
    from rollplex.specs.backend import BackendSpec

    model = MODEL_PRESETS["qwen2_5_vl_7b"]
    graph = build_step(model, WORKLOAD_PRESETS["video"], AlgoSpec())
    caps = trainer_capabilities(BackendSpec(trainer=trainer))
    out, changed = apply_trainer_capabilities(graph, caps)
    assert _grads(out) == [want] and changed is (want != _grads(graph)[0])
    step = next(op for op in out if op.kind == "optimizer_step")
    params = out.values[step.inputs["weights"]].shape[0]
    cast = op_cost(out, step, CostContext(model, WORKLOAD_PRESETS["video"])).transient_bytes
    if want == "bfloat16":  # 2.2 GB at 7B, against 15.2 GB for every gradient at once
        assert cast == 4 * model.vocab_size * model.hidden_size < 0.2 * 2 * params
    else:
        assert cast == 0
    again, changed = apply_trainer_capabilities(out, caps)
    assert not changed and again is out


def test_the_registry_and_the_trainer_classes_agree_on_the_gradients():
    from rollplex.backends import trainer_capabilities
    from rollplex.backends.fsdp.trainer import FsdpTrainer
    from rollplex.backends.torch.trainer import TorchTrainer
    from rollplex.specs.backend import BackendSpec

    assert trainer_capabilities(BackendSpec(trainer="torch")) == TorchTrainer.capabilities
    assert trainer_capabilities(BackendSpec(trainer="fsdp")) == FsdpTrainer.capabilities
    assert FsdpTrainer.capabilities.float32_grads and not TorchTrainer.capabilities.float32_grads
    # a plan for several GPUs is FSDP2's, whichever trainer the (single-process) spec names
    assert trainer_capabilities(BackendSpec(trainer="torch"), 8) == FsdpTrainer.capabilities
