"""algo.use_reference=null (the default): a reference model runs exactly when a KL term
reads it. With kl_coef=0 its forwards and weights leave the graph and the plan, and the
run trains what one with the reference kept (for the logged KL alone) trains."""

from __future__ import annotations

import hydra
import pytest
import torch
from omegaconf import OmegaConf

from rollplex.backends.step import StepConfig
from rollplex.backends.torch.data import TaskData
from rollplex.cli import _conf_dir
from rollplex.jobs.pipeline import plan_step
from rollplex.runtime import Executor
from rollplex.runtime.compose import compose
from rollplex.specs import HARDWARE_PRESETS, MODEL_PRESETS, WORKLOAD_PRESETS, AlgoSpec, ScheduleSpec

MODEL, WORKLOAD, CPU = MODEL_PRESETS["tiny"], WORKLOAD_PRESETS["tiny"], HARDWARE_PRESETS["cpu"]


def _reference_ops(algo: AlgoSpec, model=MODEL, workload=WORKLOAD, hw=CPU) -> list[str]:
    planned = plan_step(model, workload, algo, hw, ScheduleSpec(name="serial"))
    return [op.name for op in planned.graph if "ref.weights" in op.inputs.values()]


@pytest.mark.parametrize("name", ["grpo", "rloo", "ppo"])
def test_the_reference_runs_exactly_when_a_kl_term_reads_it(name):
    assert AlgoSpec(name=name, kl_coef=0.0).use_reference is False
    assert AlgoSpec(name=name, kl_coef=0.01).use_reference is True
    assert AlgoSpec(name=name, kl_coef=0.0, use_reference=True).use_reference is True
    assert _reference_ops(AlgoSpec(name=name, kl_coef=0.0)) == []
    assert _reference_ops(AlgoSpec(name=name, kl_coef=0.01))


@pytest.mark.parametrize("schedule", ["serial", "rollplex"])
@pytest.mark.parametrize("workload", ["image", "video"])
@pytest.mark.parametrize("model", ["qwen2_5_vl_3b", "qwen2_5_vl_7b"])
def test_without_the_reference_every_step_plans_shorter_and_no_larger(model, workload, schedule):
    """The reference's forwards and its weights are the work removed, on every preset."""
    m, w, hw = MODEL_PRESETS[model], WORKLOAD_PRESETS[workload], HARDWARE_PRESETS["h200x8"]
    kept, dropped = (
        plan_step(m, w, AlgoSpec(kl_coef=0.0, use_reference=ref), hw, ScheduleSpec(name=schedule))
        for ref in (True, None)
    )
    assert not [op for op in dropped.graph if op.phase.value == "reference"]
    assert dropped.plan.step_time_s < kept.plan.step_time_s
    assert dropped.plan.peak_bytes_per_gpu <= kept.plan.peak_bytes_per_gpu


def _algo(*overrides: str) -> AlgoSpec:
    """The algo group as `rollplex train <overrides>` composes it."""
    with hydra.initialize_config_dir(config_dir=_conf_dir(), version_base="1.3"):
        cfg = hydra.compose(config_name="train", overrides=[*overrides, "job=train"])
    return AlgoSpec.model_validate(OmegaConf.to_container(cfg.algo, resolve=True))


def test_the_config_groups_resolve_it_and_a_kl_coef_alone_turns_it_on():
    assert _algo("algo=grpo").use_reference is True  # kl_coef 0.04
    assert _algo("algo=grpo", "algo.kl_coef=0").use_reference is False
    # PPO's group has kl_coef 0: a KL weight on the command line is enough (it was refused)
    assert _algo("algo=ppo", "algo.kl_coef=0.05").use_reference is True
    with pytest.raises(ValueError, match="kl_coef > 0 needs use_reference=true"):
        _algo("algo=grpo", "algo.use_reference=false")


def _train(algo: AlgoSpec, steps: int = 2) -> dict[str, torch.Tensor]:
    planned = plan_step(MODEL, WORKLOAD, algo, CPU, ScheduleSpec(name="serial"))
    backend = compose(StepConfig(MODEL, algo, seed=0, max_new_tokens=4))
    executor = Executor(planned.plan, planned.graph, backend, [])
    data = TaskData(MODEL, WORKLOAD, seed=0)
    for k in range(steps):
        executor.run_step(k, data.step(k))
    return {n: p.detach().clone() for n, p in backend.trainer.model.named_parameters()}


def test_dropping_an_unread_reference_trains_the_same_weights():
    torch.use_deterministic_algorithms(True)
    try:
        kept = _train(AlgoSpec(lr=1e-3, kl_coef=0.0, use_reference=True))
        dropped = _train(AlgoSpec(lr=1e-3, kl_coef=0.0))
    finally:
        torch.use_deterministic_algorithms(False)
    assert kept.keys() == dropped.keys()
    assert all(torch.equal(kept[n], dropped[n]) for n in kept)
