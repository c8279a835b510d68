"""What the fsdp backend can run, checked from the spec and torchrun's world size before
any model is built (no torch import): each failure is a ValueError naming the field."""

from __future__ import annotations

import os

from rollplex.specs.run import RunSpec


def torchrun_world() -> int:
    """WORLD_SIZE as torchrun sets it (1 without torchrun)."""
    raw = os.environ.get("WORLD_SIZE", "1")
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"environment variable WORLD_SIZE={raw!r} is not a positive integer")
    return int(raw)


def check_fsdp_spec(spec: RunSpec, world: int | None = None) -> None:
    world = torchrun_world() if world is None else world
    t, prompts = spec.train, spec.workload.prompts_per_step
    if spec.algo.name == "ppo":
        raise ValueError(
            "train.backend=fsdp with algo=ppo: the FSDP2 trainer trains the policy only "
            "(no critic); use algo=grpo or rloo, or backend torch"
        )
    if prompts % world:
        raise ValueError(
            f"workload.prompts_per_step={prompts} does not divide over {world} torchrun "
            "ranks: each rank takes an equal, contiguous slice of the step's prompts"
        )
    dtype = t.fsdp.compute_dtype(t.device)
    if t.fsdp.rollout_sync == "alias" and (world != 1 or dtype != "float32"):
        raise ValueError(
            f"train.fsdp.rollout_sync=alias needs 1 rank computing in float32 (here {world} "
            f"ranks, {dtype}): only there is a shard the whole parameter; use gather"
        )
