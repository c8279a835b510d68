"""What the fsdp trainer can run, checked from the spec and torchrun's world size before
any model is built (no torch import): each failure is a ValueError naming the field."""

from __future__ import annotations

import logging
import os

from rollplex.specs.role_needs import needs_of
from rollplex.specs.run import RunSpec

log = logging.getLogger(__name__)


def torchrun_world() -> int:
    """WORLD_SIZE as torchrun sets it (1 without torchrun)."""
    raw = os.environ.get("WORLD_SIZE", "1")
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"environment variable WORLD_SIZE={raw!r} is not a positive integer")
    return int(raw)


def world_spec(spec: RunSpec, world: int | None = None) -> RunSpec:
    """The spec a torchrun job plans with: the plan is made for the GPUs it runs on, so a
    single-GPU hardware preset grows to WORLD_SIZE GPUs (logged; any other
    `hardware.num_gpus` must equal WORLD_SIZE, checked by `check_fsdp_spec`), and a
    colocated run's rollout TP is the one its rollout uses (`backend.fsdp.rollout_tp`), so
    the plan charges that layout's bytes."""
    world = torchrun_world() if world is None else world
    hardware, schedule = spec.hardware, spec.schedule
    if world > 1 and hardware.num_gpus == 1:
        log.info(
            "planning for torchrun's %d ranks: hardware '%s' num_gpus 1 -> %d",
            world,
            hardware.name,
            world,
        )
        hardware = hardware.model_copy(
            update={"num_gpus": world, "gpus_per_node": max(hardware.gpus_per_node, world)}
        )
    tp = spec.backend.fsdp.rollout_tp
    if schedule.name != "disaggregated" and schedule.parallel.rollout_tp != tp:
        if schedule.parallel.rollout_tp is not None:
            raise ValueError(
                f"schedule.parallel.rollout_tp={schedule.parallel.rollout_tp} but the FSDP2 "
                f"trainer's rollout runs at backend.fsdp.rollout_tp={tp}: leave the first "
                "unset or make them equal"
            )
        parallel = schedule.parallel.model_copy(update={"rollout_tp": tp})
        schedule = schedule.model_copy(update={"parallel": parallel})
    return spec.model_copy(update={"hardware": hardware, "schedule": schedule})


def check_fsdp_spec(spec: RunSpec, world: int | None = None) -> None:
    """What the fsdp trainer declares it refuses (specs/role_needs.py), then
    `check_fsdp_world`."""
    world = torchrun_world() if world is None else world
    if why := needs_of("trainer", "fsdp").refusal(spec, world):
        raise ValueError(why)
    check_fsdp_world(spec, world)


def check_fsdp_world(spec: RunSpec, world: int) -> None:
    """The fsdp trainer's layout against torchrun's `world` (its declared refusals passed)."""
    b, prompts = spec.backend, spec.workload.prompts_per_step
    if spec.schedule.name == "disaggregated":
        return check_pooled_spec(spec, world)
    if prompts % world:
        raise ValueError(
            f"workload.prompts_per_step={prompts} does not divide over {world} torchrun "
            "ranks: each rank takes an equal, contiguous slice of the step's prompts"
        )
    dtype = b.fsdp.compute_dtype(spec.train.device)
    if b.fsdp.rollout_sync == "alias" and (world != 1 or dtype != "float32"):
        raise ValueError(
            f"backend.fsdp.rollout_sync=alias needs 1 rank computing in float32 (here {world} "
            f"ranks, {dtype}): only there is a shard the whole parameter; use gather"
        )
    check_rollout_tp(spec)


def check_rollout_tp(spec: RunSpec) -> None:
    """backend.fsdp.rollout_tp against the model's widths (its sync mode and the world are
    declared in specs/role_needs.py)."""
    f, m = spec.backend.fsdp, spec.model
    t = f.rollout_tp
    if t == 1:
        return
    layer = "model.language_model.layers.*"
    for what, n, param in (
        ("attention heads", m.num_heads, f"{layer}.self_attn.q_proj"),
        ("KV heads", m.num_kv_heads, f"{layer}.self_attn.k_proj/v_proj"),
        ("intermediate size", m.intermediate_size, f"{layer}.mlp.gate_proj/up_proj/down_proj"),
        ("vocab", m.vocab_size, "model.language_model.embed_tokens/lm_head"),
    ):
        if n % t:
            raise ValueError(
                f"backend.fsdp.rollout_tp={t} does not divide the model's {n} {what} "
                f"({param}): torch's TP plan gives each rank an equal share"
            )


def check_pooled_spec(spec: RunSpec, world: int) -> None:
    """schedule=disaggregated: the pools split torchrun's ranks (planner/pools.py), each
    rollout rank holds a full model loaded by the plan's weights transfer."""
    from rollplex.planner.pools import check_pool_spec

    check_pool_spec(spec.hardware.num_gpus, spec.schedule.rollout_gpus, world)
    f = spec.backend.fsdp
    if f.rollout_sync != "gather" or f.rollout_tp != 1:
        raise ValueError(
            f"schedule=disaggregated with backend.fsdp.rollout_sync={f.rollout_sync} "
            f"rollout_tp={f.rollout_tp}: the rollout pool holds its own full copy, which the "
            "plan's weights transfer fills; use rollout_sync=gather rollout_tp=1"
        )
