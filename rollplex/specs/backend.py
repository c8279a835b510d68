"""BackendSpec: which implementation runs each role (`conf/backend/`).

    rollplex train backend.rollout=vllm backend.vllm.dtype=float32
    rollplex train backend.torch_engine.attention=sdpa
    torchrun --nproc-per-node 2 -m rollplex.cli train backend=fsdp

A name must be registered for its role (rollplex.backends.ROLES); whether it can run here
(its packages installed and importable) is checked by the job before any model loads.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from rollplex.specs.base import Spec
from rollplex.specs.fsdp import FsdpSpec
from rollplex.specs.roles import ROLE_NAMES
from rollplex.specs.torch_engine import TorchEngineSpec
from rollplex.specs.vllm import VllmSpec


def _known(role: str, name: str) -> str:
    if name not in ROLE_NAMES[role]:
        raise ValueError(f"backend.{role}={name!r} is unknown; known: {sorted(ROLE_NAMES[role])}")
    return name


class BackendSpec(Spec):
    """The role implementations of a run, chosen one by one."""

    rollout: str = Field(
        "torch",
        description="Rollout role: 'torch' (transformers modules, aliasing the trainer's "
        "weights) or 'vllm' (an in-process vLLM engine; weights loaded in place after every "
        "update).",
    )
    reference: str = Field("torch", description="Reference scorer role: 'torch'.")
    trainer: str = Field(
        "torch",
        description="Trainer role: 'torch', or 'fsdp' (FSDP2, data-parallel over torchrun's "
        "ranks; its torch rollout and reference are full models on every rank).",
    )
    torch_engine: TorchEngineSpec = Field(
        default_factory=TorchEngineSpec,
        description="Decode engine knobs of the torch rollout (read when rollout=torch).",
    )
    vllm: VllmSpec = Field(
        default_factory=VllmSpec,
        description="Engine knobs of the vLLM rollout (read when rollout=vllm).",
    )
    fsdp: FsdpSpec = Field(
        default_factory=FsdpSpec,
        description="FSDP2 sharding and casts (read when trainer=fsdp).",
    )

    @field_validator("rollout")
    @classmethod
    def _rollout(cls, v: str) -> str:
        return _known("rollout", v)

    @field_validator("reference")
    @classmethod
    def _reference(cls, v: str) -> str:
        return _known("reference", v)

    @field_validator("trainer")
    @classmethod
    def _trainer(cls, v: str) -> str:
        return _known("trainer", v)
