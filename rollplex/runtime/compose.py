"""Build the chosen roles and hand them to the one dispatch.

    dispatch = compose(StepConfig(model, algo, seed, max_new_tokens), BackendSpec(rollout="vllm"))

The trainer is built first (the other roles start from its weights), then the reference,
then the rollout. The value types are the trainer's: every role here speaks torch values
(the vLLM rollout returns torch tensors too). Whether a role can run here is checked
before anything is built (`check_roles`), so a missing vLLM costs no model load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollplex.backends import role_entry
from rollplex.backends.base import RolloutRole
from rollplex.backends.capabilities import RoleCapabilities
from rollplex.runtime.dispatch import RoleDispatch, Roles, StepConfig
from rollplex.specs.backend import BackendSpec


def check_roles(spec: BackendSpec) -> None:
    """BackendUnavailable (a ValueError) naming what to install, for any chosen role that
    cannot run here. Imports no model code."""
    for role in ("rollout", "reference", "trainer"):
        role_entry(role, getattr(spec, role)).check()


def rollout_capabilities(spec: BackendSpec) -> RoleCapabilities:
    """What the chosen rollout can do, for the planner (no engine is started, and vLLM
    need not be installed)."""
    return role_entry("rollout", spec.rollout).capabilities()


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
    check_roles(spec)
    if spec.trainer != "torch" or spec.reference != "torch":
        raise NotImplementedError("only torch reference and trainer roles are built")
    from rollplex.backends.torch.backend import TorchExternals, critic_factory
    from rollplex.backends.torch.rows import TorchValues

    trainer = role_entry("trainer", spec.trainer).builder_fn()(config)
    reference = role_entry("reference", spec.reference).builder_fn()(config, trainer)
    if rollout is None:
        rollout = role_entry("rollout", spec.rollout).builder_fn()(
            config, trainer, spec=spec, workdir=workdir, **rollout_kw
        )
    else:
        rollout.load_weights(trainer.live_weights())
    roles = Roles(
        rollout,
        reference,
        trainer,
        TorchValues(),
        TorchExternals(trainer, reference),
        critic_factory(config, trainer),
    )
    return RoleDispatch(config, roles)
