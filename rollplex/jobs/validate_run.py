"""The one check of a train run, at the edge where its spec is accepted, before any data,
plan or model loads: `validate_run(spec, facts)` refuses a bad combination by name, in a
fixed order (`ORDER`), reading what each chosen role declares (specs/role_needs.py).

What it needs to know of this process (torch's CUDA, torchrun's world, installed roles)
comes in as plain values (`RunFacts`, read once by `run_facts`), so the check is pure.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from rollplex.algos.updates import mini_batches
from rollplex.backends.base import BackendUnavailable
from rollplex.jobs.model_dtype import dtype_refusal
from rollplex.specs.hardware import DeviceInfo
from rollplex.specs.role_needs import RoleNeeds, chosen_needs, field_value
from rollplex.specs.run import RunSpec
from rollplex.specs.schedule import check_parallel

ORDER = (
    "device",  # train.device on this torch
    "sizing",  # the device's hardware, GPU defaults, the response cap (jobs/sizing.py)
    "world",  # WORLD_SIZE and RANK, the spec planned for that world (torchrun roles)
    "role refusals",  # each chosen role's declared refusals and TP degrees
    "roles available",  # each chosen role installed and importable here
    "model dtype",  # a command-line model.dtype the torch roles would not hold (model_dtype.py)
    "role world",  # a torchrun role's layout against the world (prompts, sync, widths, pools)
    "TP degrees",  # schedule.parallel against the GPUs and the model's heads (specs/schedule.py)
    "engine knobs",  # knobs whose Triton kernels cannot run on this device
    "response cap",  # train.max_new_tokens within the plan's response length
    "mini-batches",  # a PPO mini-batch no larger than the step's batch
    "adaptive KL",  # a reward-KL horizon long enough that the coefficient stays positive
    "overlong buffer",  # reward.overlong_buffer inside the response cap
)


@dataclass(slots=True, frozen=True)
class RunFacts:
    """What this process sees, as plain values (defaults: a CPU process, no torchrun)."""

    device_refusal: str | None = None  # why train.device cannot run here (jobs/devices.py)
    gpu: DeviceInfo | None = None  # the CUDA device train.device names (None: cpu)
    keys: frozenset[str] | None = None  # the command line's keys (None: a spec from Python)
    world_size: str = "1"  # WORLD_SIZE as torchrun sets it
    rank: str = "0"  # RANK as torchrun sets it
    # "backend.<role>=<name>" -> why that chosen role cannot run here (what to install)
    unavailable: Mapping[str, str] = field(default_factory=dict)
    triton: bool = False  # the engine's Triton kernels run on train.device's kind


@dataclass(slots=True, frozen=True)
class RunChecks:
    """A run that passed: the spec it runs and what the checks found."""

    spec: RunSpec  # sized for its device and planned for its world
    sized: RunSpec  # after the sizing only (what config.json records)
    notes: tuple[str, ...]  # the sizing's decisions, for the log
    world: int  # torchrun's ranks for a torchrun role, else 1
    rank: int
    needs: tuple[RoleNeeds, ...]  # the chosen roles' declarations: trainer, rollout, reference


def run_facts(spec: RunSpec) -> RunFacts:
    """The facts `validate_run` reads, for `spec`'s device and chosen roles."""
    from rollplex.backends import role_entry
    from rollplex.engine.triton_support import usable
    from rollplex.jobs import devices, sizing

    device = spec.train.device
    try:
        devices.check_device("train.device", device)
        refusal, gpu = None, sizing.read_device(device)
    except ValueError as err:
        refusal, gpu = str(err), None
    unavailable = {}
    for needs in chosen_needs(spec.backend):
        try:
            role_entry(needs.role, needs.name).check()
        except BackendUnavailable as err:
            unavailable[needs.where] = str(err)
    return RunFacts(
        refusal,
        gpu,
        sizing.command_line_keys(),
        os.environ.get("WORLD_SIZE", "1"),
        os.environ.get("RANK", "0"),
        unavailable,
        usable(device.split(":")[0]),
    )


def validate_run(spec: RunSpec, facts: RunFacts) -> RunChecks:
    """`spec` checked against `facts` in `ORDER`: the first bad combination raises a
    ValueError (BackendUnavailable for a role not installed) naming its field."""
    from rollplex.jobs.sizing import size_train

    if facts.device_refusal is not None:
        raise ValueError(facts.device_refusal)
    sized = size_train(spec, facts.keys, facts.gpu)
    needs = chosen_needs(sized.spec.backend)
    spec, world, rank = _for_world(sized.spec, needs, facts)
    check_combination(spec, needs, world, facts)
    return RunChecks(spec, sized.spec, tuple(sized.notes), world, rank, needs)


def check_combination(
    spec: RunSpec, needs: tuple[RoleNeeds, ...], world: int, facts: RunFacts
) -> None:
    """`ORDER` from "role refusals" on, for a spec already sized and planned for `world`."""
    for n in needs:
        if why := n.refusal(spec, world):
            raise ValueError(why)
    for n in needs:
        if n.where in facts.unavailable:
            raise BackendUnavailable(facts.unavailable[n.where])
    if why := dtype_refusal(spec, facts.keys):
        raise ValueError(why)
    for n in needs:
        if n.world_check:
            _hook(n.world_check)(spec, world)
    check_parallel(spec.schedule, spec.model, spec.hardware)  # plan_step's guard, made early
    _engine_knobs(spec, needs, facts.triton)
    t, w = spec.train, spec.workload
    if t.max_new_tokens > w.response_length.max:
        raise ValueError(
            f"train.max_new_tokens={t.max_new_tokens} exceeds workload."
            f"response_length.max={w.response_length.max}, which sizes the plan"
        )
    mini_batches(w.prompts_per_step, spec.algo)  # a PPO mini-batch larger than the batch
    _adaptive_kl(spec)
    if spec.reward.overlong_buffer >= t.max_new_tokens:
        raise ValueError(
            f"reward.overlong_buffer={spec.reward.overlong_buffer} must be less than "
            f"train.max_new_tokens={t.max_new_tokens}: the penalty ramps over the last "
            "overlong_buffer tokens before the cap"
        )


def _adaptive_kl(spec: RunSpec) -> None:
    """verl's adaptive controller multiplies the coefficient by 1 + e * rows / horizon with
    e in [-0.2, 0.2]: a step of 5 x kl_horizon rows or more can drive it to 0 or below."""
    a, rows = spec.algo, spec.workload.samples_per_step
    if a.kl_in_reward and a.kl_ctrl == "adaptive" and rows >= 5 * a.kl_horizon:
        raise ValueError(
            f"algo.kl_horizon={a.kl_horizon} with {rows} rows per step: kl_ctrl=adaptive "
            f"scales kl_coef by 1 + clip(kl / target_kl - 1, +-0.2) * rows / kl_horizon, "
            f"which reaches 0 or below; set algo.kl_horizon above {rows // 5}"
        )


def _for_world(
    spec: RunSpec, needs: tuple[RoleNeeds, ...], facts: RunFacts
) -> tuple[RunSpec, int, int]:
    """(the spec planned for torchrun's world, WORLD_SIZE, RANK) when a chosen role runs
    under torchrun; else (spec, 1, 0): one process, whatever the plan's GPU count."""
    if not any(n.torchrun for n in needs):
        return spec, 1, 0
    world, rank = facts.world_size, facts.rank
    if not world.isdigit() or int(world) < 1:
        raise ValueError(f"environment variable WORLD_SIZE={world!r} is not a positive integer")
    if not rank.isdigit() or int(rank) >= int(world):
        raise ValueError(f"environment variable RANK={rank!r} is not a rank of WORLD_SIZE={world}")
    for n in needs:
        if n.world_plan:
            spec = _hook(n.world_plan)(spec, int(world))
    return spec, int(world), int(rank)


def _engine_knobs(spec: RunSpec, needs: tuple[RoleNeeds, ...], triton: bool) -> None:
    """A knob that runs Triton kernels, asked for where they cannot run (at their defaults
    they are on exactly where they run)."""
    if triton:
        return
    for n in needs:
        for knob in n.cuda_knobs:
            if field_value(spec, knob) is True:
                raise ValueError(
                    f"{knob}=true with train.device={spec.train.device}: its Triton kernels "
                    "need CUDA and Triton; leave it at its default"
                )


def _hook(ref: str):
    module, fn = ref.split(":")
    return getattr(importlib.import_module(module), fn)


__all__ = [
    "ORDER",
    "RunChecks",
    "RunFacts",
    "check_combination",
    "run_facts",
    "validate_run",
]
