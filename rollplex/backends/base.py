"""What a backend is: three roles, the op kinds it runs, and how it holds memory per role.

A step's graph names *what* to compute; a backend says *how*, through three roles:
- `RolloutRole`: vision encode, prefix prefill and (segmentable) decode of multimodal
  prompts, returning token ids and per-token logprobs. It takes its weights from the
  trainer's live parameters (an alias or a rebuilt buffer) or from a checkpoint folder,
  so an engine other than torch (vLLM) can stand in for it;
- `ReferenceScorer`: logprobs under the frozen reference, split into the prefix part and
  the response part (or the full per-sample forward, as verl runs it);
- `Trainer`: the same logprobs with grad, the loss, backward, the optimizer step and the
  state a checkpoint needs.

The executor never talks to the roles: it hands each plan step to `Backend.run_op` with the
step's inputs from its environment (value name -> backend object) and stores the outputs.
Every op reports the weights versions it read, so a plan's claim that piggybacked work
reads the decode's weights is checked on every step, not assumed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar

from rollplex.graph.ir import Graph, Op


class BackendUnavailable(ValueError):
    """A backend that cannot run here: not installed, or not built yet. Says which and why.
    A ValueError: selecting it is a configuration mistake, caught before any work."""


class BackendError(RuntimeError):
    """A backend cannot run a graph or an op as asked (unsupported kind, stale weights...)."""


class Lifecycle(StrEnum):
    """Where a role's weights and state live between the phases that use them."""

    RESIDENT = "resident"  # stays on the device for the whole step
    OFFLOADED = "offloaded"  # moved to host between uses, when the plan says so
    RELEASED = "released"  # dropped after use and rebuilt from the trainer (vLLM sleep)


# -- weights sources ---------------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class LiveWeights:
    """The trainer's own parameters at `version`: a rollout aliases them (colocated torch)
    or rebuilds its layout from them (another TP degree, another engine)."""

    params: Any  # backend-specific handle on the trainer's parameters
    model: str
    version: int


@dataclass(slots=True, frozen=True)
class CheckpointWeights:
    """A model folder (`config.json` + `model.safetensors`, Hub tensor names)."""

    folder: Path
    model: str
    version: int


WeightsSource = LiveWeights | CheckpointWeights


def version_name(model: str, version: int) -> str:
    return f"{model}@{version}"


# -- the roles ---------------------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class Sampling:
    max_new_tokens: int
    temperature: float
    top_p: float
    eos_id: int
    pad_id: int


class DecodeSession(ABC):
    """A decode that can stop after any step and resume with the same RNG stream."""

    @abstractmethod
    def advance(self, steps: int | None = None) -> bool:
        """Run up to `steps` decode steps (all when None); True once finished."""

    @property
    @abstractmethod
    def steps_left(self) -> int: ...

    @abstractmethod
    def result(self) -> Any:
        """Token ids [S, R], per-token logprobs [S, R] and lengths [S], once finished."""


class RolloutRole(ABC):
    op_kinds: ClassVar[frozenset[str]] = frozenset({"vision_encode", "prefix_prefill", "decode"})

    @abstractmethod
    def load_weights(self, source: WeightsSource) -> str:
        """Take the weights the next rollout reads; returns their version name."""

    @property
    @abstractmethod
    def weights_version(self) -> str: ...

    @abstractmethod
    def vision_encode(self, pixels: Any) -> Any: ...

    @abstractmethod
    def prefix_prefill(self, features: Any, text: Any) -> Any: ...

    @abstractmethod
    def start_decode(
        self, prefix: Any, group_size: int, sampling: Sampling, generator: Any
    ) -> DecodeSession: ...


class ReferenceScorer(ABC):
    op_kinds: ClassVar[frozenset[str]] = frozenset(
        {"vision_encode", "logprob_prefix", "logprob_response", "logprob"}
    )

    @abstractmethod
    def vision_encode(self, pixels: Any) -> Any: ...

    @abstractmethod
    def logprob_prefix(self, features: Any, text: Any) -> Any: ...

    @abstractmethod
    def logprob_response(self, prefix: Any, responses: Any, group_size: int) -> Any: ...

    @abstractmethod
    def logprob(self, features: Any, text: Any, responses: Any) -> Any:
        """The full per-sample forward (no prefix reuse)."""


class Trainer(ABC):
    op_kinds: ClassVar[frozenset[str]] = frozenset(
        {
            "vision_encode",
            "logprob_prefix",
            "logprob_response",
            "logprob",
            "policy_loss",
            "backward",
            "optimizer_step",
        }
    )

    @abstractmethod
    def live_weights(self) -> LiveWeights:
        """The parameters as they are now, for a rollout to alias or rebuild from."""

    @abstractmethod
    def vision_encode(self, pixels: Any) -> Any: ...

    @abstractmethod
    def logprob_prefix(self, features: Any, text: Any) -> tuple[Any, Any]:
        """(prefix with grad, activations kept for backward)."""

    @abstractmethod
    def logprob_response(self, prefix: Any, responses: Any, group_size: int) -> tuple[Any, Any]:
        """(logprobs with grad, activations kept for backward)."""

    @abstractmethod
    def logprob(self, features: Any, text: Any, responses: Any) -> tuple[Any, Any]: ...

    @abstractmethod
    def loss(
        self, logprobs: Any, old: Any, advantages: Any, ref: Any | None, **attrs: Any
    ) -> Any: ...

    @abstractmethod
    def backward(self, loss: Any) -> Any:
        """Gradients of the loss w.r.t. the trained parameters."""

    @abstractmethod
    def optimizer_step(self, grads: Any) -> int:
        """Update in place; returns the new weights version."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs besides the weights (optimizer state, version)."""

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...

    @abstractmethod
    def save_weights(self, folder: Path) -> None:
        """Write the weights as a model folder a `CheckpointWeights` can name."""

    @abstractmethod
    def load_weights(self, folder: Path) -> None: ...


# -- what the executor calls -------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class Chunk:
    """Which part of an op a plan step runs: rows chunk `index` of `count` for prefix work,
    or decode segment `index` of `count`."""

    index: int = 0
    count: int = 1

    @property
    def last(self) -> bool:
        return self.index == self.count - 1


@dataclass(slots=True)
class OpResult:
    """Outputs by port (empty until an op's last chunk) and the weights versions it read."""

    outputs: dict[str, Any] = field(default_factory=dict)
    reads: dict[str, str] = field(default_factory=dict)  # port -> "<model>@<version>"


class Backend(ABC):
    """Runs a step graph's ops over an environment of backend values."""

    name: ClassVar[str]
    roles: ClassVar[Mapping[str, type]] = {
        "rollout": RolloutRole,
        "reference": ReferenceScorer,
        "trainer": Trainer,
    }
    #: Role-free op kinds (data shuffling and scalar math).
    own_kinds: ClassVar[frozenset[str]] = frozenset()
    #: Where each role keeps its weights and state between uses.
    lifecycle: ClassVar[Mapping[str, Lifecycle]]

    @classmethod
    def op_kinds(cls) -> frozenset[str]:
        kinds = set(cls.own_kinds)
        for role in cls.roles.values():
            kinds |= role.op_kinds
        return frozenset(kinds) | {"weight_sync"}

    def check_graph(self, graph: Graph) -> None:
        """Raise BackendError naming every op whose kind this backend does not run."""
        missing = [f"{op.name} ({op.kind})" for op in graph if op.kind not in self.op_kinds()]
        if missing:
            raise BackendError(
                f"backend '{self.name}' does not implement: {', '.join(missing)}; it runs "
                f"{sorted(self.op_kinds())}"
            )

    @abstractmethod
    def bind(self, graph: Graph) -> None:
        """Learn which external values of `graph` are which (weights, prompts...)."""

    @abstractmethod
    def begin_step(self, step: int, inputs: Any) -> dict[str, Any]:
        """Start RL step `step` on `inputs`; returns the graph's external values by name."""

    @abstractmethod
    def run_op(
        self, op: Op, inputs: dict[str, Any], chunk: Chunk, carry: dict[str, Any]
    ) -> OpResult:
        """Run `op` (or one chunk of it) on `inputs` (port -> value). `carry` persists between
        the chunks of one op and is dropped after the last."""

    @abstractmethod
    def end_step(self) -> dict[str, float]:
        """Finish the step; returns its metrics (reward, KL, loss...)."""

    @abstractmethod
    def move(self, value: Any, to_host: bool) -> Any:
        """Copy `value` to host memory (offload) or back to the device (onload); returns the
        moved value. In-place holders (weights, optimizer state) move their tensors."""
