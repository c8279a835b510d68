"""Build the chosen roles and hand them to the one dispatch.

    dispatch = compose(StepConfig(model, algo, seed, max_new_tokens), BackendSpec(rollout="vllm"))
The trainer is built first (the others start from its weights), then the reference, then the
rollout; a trainer entry may bring its own rollout, reference and runtime (FSDP2 does). It
checks nothing: the jobs check the chosen roles at their edge (train: jobs/validate_run.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollplex.backends import role_entry
from rollplex.backends.base import RolloutRole
from rollplex.backends.step import Roles, StepConfig
from rollplex.planner.pools import Pools
from rollplex.runtime.dispatch import RoleDispatch
from rollplex.specs.backend import BackendSpec


def check_roles(spec: BackendSpec) -> None:
    """BackendUnavailable (a ValueError) naming what to install, for any chosen role that
    cannot run here. Imports no model code. Kept for the eval job's edge (jobs/eval.py); a
    train run's is jobs/validate_run.py."""
    for role in ("rollout", "reference", "trainer"):
        role_entry(role, getattr(spec, role)).check()


def compose(
    config: StepConfig,
    spec: BackendSpec | None = None,
    workdir: Path | None = None,
    rollout: RolloutRole | None = None,
    **rollout_kw: Any,
) -> RoleDispatch:
    """The roles `spec` names, built for `config`, behind one RoleDispatch. `workdir`: where
    an engine rollout may write the model folder it starts from (default: a temp dir);
    `rollout_kw` go to the rollout's builder (vLLM: `max_pixels` of the prompt renderer).
    `rollout`: a rollout role already built (a started engine, whose start-up is the
    expensive part) to reuse; it is given the new trainer's weights."""
    spec = spec or BackendSpec()
    if spec.reference != "torch":
        raise ValueError(f"backend.reference={spec.reference!r}: only 'torch' is built")
    from rollplex.backends.hooks import StepHooks
    from rollplex.backends.step import RoleRuntime
    from rollplex.backends.torch.backend import TorchExternals, critic_factory
    from rollplex.backends.torch.rows import TorchValues

    entry = role_entry("trainer", spec.trainer)
    trainer = entry.builder_fn()(config, spec=spec)
    # A sharded trainer brings its own step config (a rank's device), values and hooks,
    # and its own builders of the torch roles that read its weights.
    runtime_fn = entry.builder_fn("runtime")
    run = (
        runtime_fn(config, trainer)
        if runtime_fn
        else RoleRuntime(config, TorchValues(), StepHooks())
    )
    config = run.config
    # No graph of a run without a KL term reads a reference: building one anyway held a
    # whole unplanned model copy on the device (5.7 GiB at 3B, bench/results/gpu_profile/).
    reference = None
    if config.algo.use_reference:
        build_reference = entry.builder_fn("reference_builder")
        build_reference = build_reference or role_entry("reference", "torch").builder_fn()
        reference = build_reference(config, trainer)
    if rollout is None:
        build = entry.builder_fn("rollout_builder") if spec.rollout == "torch" else None
        build = build or role_entry("rollout", spec.rollout).builder_fn()
        rollout = build(config, trainer, spec=spec, workdir=workdir, **rollout_kw)
    else:
        rollout.load_weights(trainer.live_weights())
    roles = Roles(
        rollout,
        reference,
        trainer,
        run.values,
        TorchExternals(trainer, reference),
        run.critic_factory if runtime_fn else critic_factory(config, trainer),
        run.hooks,
    )
    return RoleDispatch(config, roles)


def build_pool_backend(config: StepConfig, spec: BackendSpec, pools: Pools) -> RoleDispatch:
    """This rank's roles of a pooled plan (backends/fsdp/pools.py) behind one RoleDispatch,
    with `.pool_side` (what the plan's transfers read and write) and `.dist` set."""
    from rollplex.backends.fsdp.pools import PoolSide, build_pool_roles

    built = build_pool_roles(config, spec, pools)
    dispatch = RoleDispatch(built.config, built.roles)
    dispatch.pool_side = PoolSide(dispatch, built.hooks, built.wire)  # type: ignore[attr-defined]
    dispatch.dist = built.dist  # type: ignore[attr-defined]
    return dispatch
