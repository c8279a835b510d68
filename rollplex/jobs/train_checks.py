"""What the train job refuses before anything loads: combinations the torch backend, the
FSDP2 trainer, vLLM or the plan's sizing cannot run, each named by its field."""

from __future__ import annotations

from rollplex.algos.updates import mini_batches
from rollplex.specs.run import RunSpec
from rollplex.specs.torch_engine import TorchEngineSpec


def check_spec(spec: RunSpec) -> None:
    """What the torch backend and the synthetic task can run; raises ValueError."""
    t, w = spec.train, spec.workload
    fsdp_tp = spec.backend.trainer == "fsdp" and spec.backend.fsdp.rollout_tp > 1
    if t.response_lengths == "workload" and fsdp_tp:
        raise ValueError(
            "train.response_lengths=workload with backend.fsdp.rollout_tp > 1: a TP group "
            "decodes its members' rows together; use rollout_tp=1"
        )
    if spec.algo.kl_in_reward and spec.backend.rollout == "vllm":
        raise ValueError(
            "algo.kl_in_reward with backend.rollout=vllm: the KL penalty in the reward needs "
            "the rollout's logprobs of logits/T before training, and vLLM returns raw "
            "logprobs (before temperature); use backend.rollout=torch or kl_in_reward=false"
        )
    from rollplex.runtime.compose import check_roles

    check_roles(spec.backend)  # BackendUnavailable (a ValueError) says what to install
    if spec.backend.trainer == "fsdp":
        from rollplex.backends.fsdp.checks import check_fsdp_spec

        check_fsdp_spec(spec)
    if spec.algo.name == "ppo" and t.resume:
        raise ValueError(
            "train.resume with algo=ppo: checkpoints hold the policy, not the critic, so a "
            "resumed PPO run would restart its critic; run PPO without resuming"
        )
    if spec.backend.rollout == "torch":
        _check_triton_knobs(spec.backend.torch_engine, t.device)
    if t.max_new_tokens > w.response_length.max:
        raise ValueError(
            f"train.max_new_tokens={t.max_new_tokens} exceeds workload."
            f"response_length.max={w.response_length.max}, which sizes the plan"
        )
    mini_batches(w.prompts_per_step, spec.algo)  # a PPO mini-batch larger than the batch


def _check_triton_knobs(engine: TorchEngineSpec, device: str) -> None:
    """The decode engine's Triton knobs asked for where their kernels cannot run: refused
    by name before any model loads (at their defaults all three are on where they run)."""
    knobs = {
        "skinny_gemm": engine.skinny_gemm,
        "split_kernel": engine.split_kernel,
        "split_gemm": engine.split_gemm,
    }
    if not any(knobs.values()):
        return
    from rollplex.engine.triton_support import usable

    if usable(device.split(":")[0]):
        return
    name = next(k for k, on in knobs.items() if on)
    raise ValueError(
        f"backend.torch_engine.{name}=true with train.device={device}: its Triton kernels "
        "need CUDA and Triton; leave it at its default"
    )
