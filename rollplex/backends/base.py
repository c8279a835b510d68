"""What a backend is: three role protocols (rollout, reference scorer, trainer), the op
kinds each runs, their value ops, and `Backend`, what the executor drives. Each role class
declares what it can do (`capabilities`, data in specs/roles.py) and the planner reads only
that; where a role's weights live between uses is the plan's decision (its residency
actions), what a role can free is `RoleCapabilities.sleep_levels`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from rollplex.graph.ir import Graph, Op
from rollplex.specs.roles import RoleCapabilities


class BackendUnavailable(ValueError):
    """A backend that cannot run here: not installed, or not built yet. Says which and why.
    A ValueError: selecting it is a configuration mistake, caught before any work."""


class BackendError(RuntimeError):
    """A backend cannot run a graph or an op as asked (unsupported kind, stale weights...)."""


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
    # Forced response lengths, one per row (prompt-major): row r ends after exactly
    # lengths[r] tokens and eos is ignored. Benchmarks give random-weight models (which
    # never stop) the workload's length distribution; None: rows end at eos or the cap.
    lengths: tuple[int, ...] | None = None


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

    def kept(self) -> Any:
        """What a finished decode started by `start_decode_kept` kept for the trainer,
        carrying the weights version that decoded (`version`)."""
        raise BackendError(f"{type(self).__name__} kept no activations")

    def ride(self, rows: Any) -> Any:
        """Run the next decode step with another phase's prefix rows (a trainer's
        `ride_rows`) in its GEMMs, and return what it computed for them (torch's
        engine/riders.py); None where this session cannot host rows."""
        return None


class RolloutRole(ABC):
    """Vision encode, prefix prefill and (segmentable) decode of multimodal prompts,
    returning token ids and per-token logprobs. It takes its weights from the trainer's
    live parameters (an alias or a rebuilt buffer) or from a checkpoint folder, so an
    engine other than torch (vLLM) can stand in for it."""

    op_kinds: ClassVar[frozenset[str]] = frozenset(
        {"vision_encode", "prefix_prefill", "decode", "generate"}
    )
    capabilities: ClassVar[RoleCapabilities] = RoleCapabilities()

    @abstractmethod
    def load_weights(self, source: WeightsSource) -> str:
        """Take the weights the next rollout reads; returns their version name."""

    @property
    @abstractmethod
    def weights_version(self) -> str: ...

    @abstractmethod
    def vision_encode(self, pixels: Any) -> Any: ...

    @abstractmethod
    def prefix_prefill(self, features: Any, text: Any) -> Any:
        """A role with `capabilities.fused_prefix` only assembles requests here: its engine
        encodes and prefills inside decode (the planner then plans one `generate` op)."""

    def merge_rows(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        """The outputs of an op's row chunks (run with `head=False`), merged in row order.
        Only roles whose capabilities allow row chunks (prefix work) implement it."""
        raise BackendError(f"{type(self).__name__} cannot merge row chunks")

    def prefix_prefill_exported(self, features: Any, text: Any) -> tuple[Any, Any]:
        """(prefix, export): the prefill that also keeps what a checkpointed training
        prefix forward keeps, for `Trainer.attach_exported`; only roles declaring
        `capabilities.activation_export` implement it (graph/passes/prefill_once.py)."""
        raise BackendError(f"{type(self).__name__} cannot export its prefill's activations")

    @abstractmethod
    def start_decode(
        self, prefix: Any, group_size: int, sampling: Sampling, generator: Any
    ) -> DecodeSession: ...

    def start_decode_kept(
        self, prefix: Any, group_size: int, sampling: Sampling, generator: Any
    ) -> DecodeSession:
        """`start_decode` whose session also keeps what a checkpointed training response
        forward keeps (`DecodeSession.kept`, for `Trainer.attach_decoded`); only roles
        declaring `capabilities.activation_export` implement it (graph/passes/decode_once.py)."""
        raise BackendError(f"{type(self).__name__} cannot keep its decode's activations")


class ReferenceScorer(ABC):
    """Logprobs under the frozen reference, split into the prefix part and the response
    part (or the full per-sample forward, as verl runs it)."""

    op_kinds: ClassVar[frozenset[str]] = frozenset(
        {"vision_encode", "logprob_prefix", "logprob_response", "logprob"}
    )
    capabilities: ClassVar[RoleCapabilities] = RoleCapabilities()
    # whether the response part runs on the rows' real tokens packed
    # (`Plan.meta["pack_responses"]`, set by the executor through the backend)
    packed_responses: bool = True

    def merge_rows(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        """See RolloutRole.merge_rows."""
        raise BackendError(f"{type(self).__name__} cannot merge row chunks")

    @abstractmethod
    def vision_encode(self, pixels: Any) -> Any: ...

    @abstractmethod
    def logprob_prefix(self, features: Any, text: Any) -> Any: ...

    @abstractmethod
    def logprob_response(self, prefix: Any, responses: Any, group_size: int) -> Any: ...

    @abstractmethod
    def logprob(self, features: Any, text: Any, responses: Any) -> Any:
        """The full per-sample forward (no prefix reuse)."""

    def logprob_prefix_exported(self, features: Any, text: Any) -> tuple[Any, Any]:
        """(prefix, export): see RolloutRole.prefix_prefill_exported. A scorer whose
        weights a training forward also reads (PPO's critic) implements it."""
        raise BackendError(f"{type(self).__name__} cannot export its prefix activations")


class Trainer(ABC):
    """The same logprobs with grad, the loss, backward, the optimizer step and the state a
    checkpoint needs."""

    op_kinds: ClassVar[frozenset[str]] = frozenset(
        {
            "vision_encode",
            "logprob_prefix",
            "attach_prefix",
            "attach_response",
            "logprob_response",
            "logprob",
            "policy_loss",
            "backward",
            "optimizer_step",
        }
    )
    capabilities: ClassVar[RoleCapabilities] = RoleCapabilities()
    # Micro-batches the training forward and backward of a step run in: the plan's
    # (`Plan.meta["train_micro_batches"]`), set by the executor through the backend; and
    # whether each forward runs again in the backward (`["train_micro_recompute"]`).
    micro_batches: int = 1
    micro_recompute: bool = False
    micro_fused: bool = False  # `["train_micro_fused"]`: forward inside the backward
    fused_micro_batches: ClassVar[bool] = True  # whether it can run `micro_fused`
    packed_responses: bool = True  # `["pack_responses"]`: response forwards on real tokens
    lr: float | None = None  # the last optimizer step's learning rate, where it tracks one

    def merge_rows(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        """See RolloutRole.merge_rows."""
        raise BackendError(f"{type(self).__name__} cannot merge row chunks")

    @abstractmethod
    def live_weights(self) -> LiveWeights:
        """The parameters as they are now, for a rollout to alias or rebuild from."""

    @abstractmethod
    def vision_encode(self, pixels: Any) -> Any: ...

    @abstractmethod
    def logprob_prefix(self, features: Any, text: Any) -> tuple[Any, Any]:
        """(prefix with grad, activations kept for backward)."""

    @abstractmethod
    def logprob_response(
        self, prefix: Any, responses: Any, group_size: int, advantages: Any = None
    ) -> tuple[Any, Any]:
        """(logprobs with grad, activations kept for backward). `advantages` (a tensor
        [rows], where the graph gives it: algo.skip_zero_advantage): the rows of groups whose
        advantages are all 0 may go untrained, their gradient being exactly 0."""

    @abstractmethod
    def logprob(
        self, features: Any, text: Any, responses: Any, advantages: Any = None
    ) -> tuple[Any, Any]: ...

    def ride_rows(self, features: Any, text: Any) -> Any:
        """`logprob_prefix`'s rows, prepared to ride a decode step (DecodeSession.ride);
        None where this trainer cannot (then it runs separately). The caller has checked
        that they read the weights version the decode reads."""
        return None

    def attach_ridden(
        self, ridden: Any, features: Any, head: bool = True, micro_batches: int | None = None
    ) -> tuple[Any, Any]:
        """What `logprob_prefix` returns, from a ride's result; a trainer's backward
        recomputes its rows in `micro_batches` ranges (None: its own count)."""
        raise BackendError(f"{type(self).__name__} cannot take a ridden prefix")

    def attach_exported(self, exported: Any, features: Any, head: bool = True) -> tuple[Any, Any]:
        """What `logprob_prefix` returns, from a rollout's `prefix_prefill_exported` at this
        trainer's weights version; only trainers declaring `activation_export`."""
        raise BackendError(f"{type(self).__name__} cannot take an exported prefill")

    def attach_decoded(
        self, prefix: Any, responses: Any, group_size: int, kept: Any, advantages: Any = None
    ) -> tuple[Any, Any]:
        """What `logprob_response` returns, from the decode that drew `responses`
        (`DecodeSession.kept`) at this trainer's weights version; only trainers declaring
        `activation_export`."""
        raise BackendError(f"{type(self).__name__} cannot take a decode's activations")

    def scorer(self) -> ReferenceScorer:
        """The trained model scored without grad at its live version: PPO mini-batches'
        old-logprob forward (verl's compute_log_prob), before the first update."""
        raise BackendError(f"{type(self).__name__} cannot score without grad (PPO mini-batches)")

    @abstractmethod
    def loss(
        self,
        logprobs: Any,
        old: Any,
        advantages: Any,
        ref: Any | None,
        *,
        rollout: Any | None = None,
        **attrs: Any,
    ) -> Any:
        """The policy loss; `rollout`: the rollout engine's logprobs, which
        algo.rollout_correction weighs the tokens by."""

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


# -- the values a backend keeps in the executor's environment ------------------------------
class ValueOps(ABC):
    """Role-free handling of a backend's value types: the runtime cuts prefix inputs into
    row chunks, repeats rows for `expand_group` and moves values between host and device
    through these, without knowing the types (torch: backends/torch/rows.py)."""

    @abstractmethod
    def rows(self, inputs: Mapping[str, Any]) -> int:
        """Prompt rows of a prefix op's inputs."""

    @abstractmethod
    def select(self, value: Any, lo: int, hi: int) -> Any:
        """Rows [lo, hi) of a row-wise value; anything else (weights) as is."""

    def row_count(self, value: Any) -> int:
        """Rows of one row-wise value (a PPO mini-batch's `select_rows` reads it)."""
        raise BackendError(f"{type(self).__name__} cannot count the rows of {type(value)}")

    @abstractmethod
    def repeat(self, value: Any, group_size: int) -> Any:
        """Each row repeated `group_size` times, in place (row r -> rows r*G .. r*G+G-1)."""

    @abstractmethod
    def move(self, value: Any, device: Any, share: float = 1.0) -> Any:
        """A copy of `value` on `device`; in-place holders (weights) move their tensors.
        `share` < 1: optimizer state moves that share of its bytes, the rest stays."""


# -- what the executor calls -------------------------------------------------------------
@dataclass(slots=True, frozen=True)
class Chunk:
    """Which part of an op a plan step runs: rows chunk `index` of `count` for prefix work,
    or decode segment `index` of `count`."""

    index: int = 0
    count: int = 1
    rides: bool = False  # prefix rows ride the live decode's next step (plan: piggyback)

    @property
    def last(self) -> bool:
        return self.index == self.count - 1


@dataclass(slots=True)
class OpResult:
    """Outputs by port (empty until an op's last chunk) and the weights versions it read."""

    outputs: dict[str, Any] = field(default_factory=dict)
    reads: dict[str, str] = field(default_factory=dict)  # port -> "<model>@<version>"
    deviation: str = ""  # where the backend could not run the step as planned, and why
    # what the step did that its plan did not price (rows a training op skipped): the trace
    # shows it, and calibration leaves the step out
    note: str = ""


class Backend(ABC):
    """What the executor drives: a step graph's ops over an environment of values.
    `rollplex.runtime.dispatch.RoleDispatch` is the one implementation, over any roles
    (op -> role routing, row chunks, role-free ops). Every op reports the weights versions
    it read, so a plan's claim that piggybacked work reads the decode's weights is checked
    on every step, not assumed."""

    name: ClassVar[str] = "roles"

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
    def move(self, value: Any, to_host: bool, share: float = 1.0) -> Any:
        """Copy `value` to host memory (offload) or back to the device (onload); returns the
        moved value. In-place holders (weights, optimizer state) move their tensors; with
        `share` < 1 (the plan's copy step's), optimizer state moves that share of them."""

    def train_micro_batches(self, count: int, recompute: bool = False, fused: bool = False) -> None:
        """Apply the plan's training micro-batch count (`Plan.meta["train_micro_batches"]`):
        the trainer runs each step's training forward and backward in that many, as the
        plan sized them; with `recompute` (`["train_micro_recompute"]`) each micro-batch's
        forward runs again inside the backward, so one micro-batch's activations are held
        at a time; with `fused` (`["train_micro_fused"]`) each runs its forward only there,
        with its backward (verl's). Backends without a trainer ignore it."""
        return None

    def pack_responses(self, on: bool) -> None:
        """Apply the plan's `Plan.meta["pack_responses"]` (schedule.pack_responses): the
        response forwards run on the rows' real tokens packed, or padded. Backends
        without such forwards ignore it."""
        return None

    def op_micro_batches(self, counts: dict[str, int]) -> None:
        """Apply the plan's other micro-batch counts (`Plan.meta["op_micro_batches"]`, op ->
        count, ops/micro_batches.py): each such forward runs over its rows in that many
        contiguous ranges, its outputs merged in row order, as the plan priced its scratch.
        Backends that run no such op ignore it."""
        return None

    def residency(self, action: Any) -> None:
        """Apply an engine residency action of the plan (runtime/engine_residency.py:
        sleep or wake the rollout engine). Backends without an engine ignore it."""
        return None
