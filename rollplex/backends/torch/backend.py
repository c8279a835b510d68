"""The torch roles, built from a StepConfig, and the step's external values as torch values.

`TorchTrainer` (trainer.py), `TorchReference` (a frozen copy of the initial policy),
`TorchRollout` (aliases the trainer's module: `weight_sync` copies nothing) and PPO's critic
(built on first use). Routing, chunks and role-free ops are the runtime's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from rollplex.backends.base import BackendError
from rollplex.backends.torch.compiled_pieces import compile_text_pieces
from rollplex.backends.torch.critic import TorchCritic, build_critic_model
from rollplex.backends.torch.handles import OptimizerHandle, VersionCounter, WeightsHandle
from rollplex.backends.torch.masters import own_masters
from rollplex.backends.torch.model import model_for
from rollplex.backends.torch.roles import (
    TorchReference,
    TorchRollout,
    vision_params,
    weights_params,
)
from rollplex.backends.torch.rows import text_only
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.backends.torch.values import Pixels
from rollplex.graph.ir import Graph, ValueKind, version_model
from rollplex.specs.backend import BackendSpec

if TYPE_CHECKING:
    from rollplex.backends.step import StepConfig


def one_gpu_model(config: StepConfig) -> torch.nn.Module:
    """`model_for`, with the text layers' norms, MLPs and attention merge compiled on CUDA
    (compiled_pieces.py; bench/results/gpu_compiled_pieces/). The FSDP2 builders call
    `model_for` alone: sharded and TP modules have not run compiled pieces on GPUs."""
    device = torch.device(config.device)
    model = model_for(config.model, config.seed, device)
    return compile_text_pieces(model) if device.type == "cuda" else model


def build_trainer(config: StepConfig, **_: Any) -> TorchTrainer:
    """The policy from the folder `model.path` names, else random weights from the seed."""
    return TorchTrainer(one_gpu_model(config), config.model, config.algo)


def build_reference(config: StepConfig, trainer: TorchTrainer) -> TorchReference:
    ref = one_gpu_model(config)
    ref.requires_grad_(False)
    if not config.model.trainable_vision:  # one frozen tower for all (see roles.py)
        ref.model.visual = trainer.model.model.visual
    return TorchReference(ref, config.algo.temperature)


def build_rollout(
    config: StepConfig, trainer: TorchTrainer, spec: BackendSpec | None = None, **_: Any
) -> TorchRollout:
    engine = (spec or BackendSpec()).torch_engine
    rollout = TorchRollout(config.model, torch.device(config.device), engine)
    rollout.load_weights(trainer.live_weights())
    return rollout


def critic_factory(config: StepConfig, trainer: TorchTrainer):
    """PPO: a critic of its own, a copy of the policy as it is when a graph first needs it."""

    def build() -> TorchCritic:
        model = build_critic_model(trainer.model, config.model, config.seed)
        return TorchCritic(model, config.model, config.algo)

    return build


class TorchExternals:
    """Which external value of a graph is which (weights, optimizer state, prompts), and
    their torch values at the start of each step."""

    def __init__(self, trainer: TorchTrainer, reference: TorchReference | None) -> None:
        self.trainer, self.reference = trainer, reference
        self._frozen = VersionCounter(0)

    def bind(self, graph: Graph) -> dict[str, str]:
        out: dict[str, str] = {}
        for v in graph.values.values():
            if not v.external:
                continue
            if v.kind is ValueKind.WEIGHTS:
                what = version_model(v.version)
                if what not in ("policy", "ref", "vision", "critic"):
                    raise BackendError(f"external weights '{v.name}' of unknown model {what!r}")
            elif v.kind is ValueKind.OPTIMIZER_STATE:
                what = "critic_adam" if version_model(v.version) == "critic" else "adam"
            else:
                ports = {
                    p for op in graph.consumers(v.name) for p, x in op.inputs.items() if x == v.name
                }
                what = next((p for p in ("pixels", "text", "answers") if p in ports), None)
                if what is None:
                    raise BackendError(
                        f"external value '{v.name}' feeds {sorted(ports)}: the "
                        "torch roles take pixels, text and answers"
                    )
            if what == "ref" and self.reference is None:
                raise BackendError(f"'{v.name}': the graph reads a reference, none was built")
            out[v.name] = what
        return out

    @staticmethod
    def pixels(batch: Any) -> Pixels:
        return Pixels.of(batch)

    def supply(self, names: dict[str, str], inputs: Any, dispatch: Any) -> dict[str, Any]:
        batch = inputs.batch  # host data: the executor loads it when the plan allocates it
        wanted = set(names.values())
        source: dict[str, Any] = {
            "pixels": Pixels.of(batch) if "pixels" in wanted else None,
            "text": text_only(batch),
            # the samples (answers as text) when a scorer grades text, else answer ids
            "answers": inputs.samples if dispatch.config.scorer else inputs.answers,
            "policy": self.trainer.handle(),
            "vision": WeightsHandle(
                "vision", self.trainer.model, vision_params(self.trainer.model), 0, self._frozen
            ),
            "adam": OptimizerHandle(self.trainer.optimizer, self.trainer.master_tensors()),
        }
        if self.reference is not None:
            model = self.reference.model
            params = weights_params(model, self.trainer.spec)
            source["ref"] = WeightsHandle("ref", model, params, 0, self._frozen)
        if dispatch.critic is not None:
            source["critic"] = dispatch.critic.handle()
            critic = dispatch.critic
            source["critic_adam"] = OptimizerHandle(critic.optimizer, own_masters(critic.masters))
        return {name: source[what] for name, what in names.items()}
