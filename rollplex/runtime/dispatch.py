"""RoleDispatch: the one place that runs a step graph's ops on whatever roles were chosen.
Every mix of roles (torch or vLLM rollout, torch reference, torch or FSDP2 trainer) goes
through here; backends provide roles and their value types only. The rollout side lives in
rollout_ops.py, the forwards in forward_ops.py, the role-free ops in role_free.py.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import torch

from rollplex.backends.base import (
    Backend,
    BackendError,
    Chunk,
    OpResult,
    ReferenceScorer,
    RolloutRole,
    Sampling,
    Trainer,
)
from rollplex.backends.step import Roles, StepConfig, StepInputs
from rollplex.data.prompts import PromptBatch
from rollplex.graph.ir import Graph, Op, Phase, version_model
from rollplex.runtime.forward_ops import ForwardOps
from rollplex.runtime.role_free import RoleFreeOps, rewards
from rollplex.runtime.rollout_ops import RolloutOps

log = logging.getLogger(__name__)
PREFIX_KINDS = frozenset({"vision_encode", "prefix_prefill", "logprob_prefix"})
ROLE_FREE_KINDS = frozenset({"expand_group", "select_rows", "reward", "advantage", "value_loss"})
ROLE_KINDS = {
    Phase.ROLLOUT: RolloutRole.op_kinds,
    Phase.REFERENCE: ReferenceScorer.op_kinds,
    Phase.TRAIN: Trainer.op_kinds,
    Phase.UPDATE: frozenset({"optimizer_step", "weight_sync"}),
}


class RoleDispatch(Backend):
    """Runs each op on its role. Per op:
    - routing: by the op's phase and kind. Rollout ops go to the rollout role, reference
      ops to the reference scorer, training and update ops to the trainer; ops that read
      the critic's weights (PPO) go to the critic. `weight_sync` hands the trainer's live
      weights to the rollout (an alias for a colocated torch rollout, an in-place load for
      an engine); `generate` is the whole rollout in one engine op (planned for a rollout
      whose capabilities say `fused_prefix`, see planner/capabilities.py);
    - forwards (forward_ops.py): prefix ops in the plan's row chunks or micro-batches,
      scoring over responses, and the attaches. A chunk the plan piggybacks rides the live
      decode's next step (rollout_ops.ride); where it cannot, it runs separately and the
      step reports the deviation. A prefill with an `exported` output
      (graph/passes/prefill_once.py) also keeps what the training prefix forward would;
      `attach_prefix` hands that to the trainer (and a decode with a `kept` output,
      graph/passes/decode_once.py, what the training response forward would;
      `attach_response`);
    - the rollout side (decode segments, engine prompts, weight syncs, the engine's
      sleep/wake, evaluation's generate): rollout_ops.py;
    - role-free ops (expand_group, select_rows, reward, advantage, value_loss): role_free.py;
    - PPO mini-batches (algos/updates.py): the old-logprob forward is a reference-phase op
      that reads the policy's weights; it runs on the trainer's no-grad scorer
      (`Trainer.scorer`), as does its frozen vision tower's when no reference model is
      loaded. Each update's loss metrics are averaged over the step's updates, as verl's
      `reduce_metrics` averages its per-micro-batch `pg_clipfrac`, `ppo_kl`, ...;
    - step hooks (backends/hooks.py): which prompts this process runs, the decode's
      generators and the logged metrics; a data-parallel trainer (FSDP2) brings its own.

    Old logprobs: a rollout that returns none (vLLM without `return_logprobs`, or whose
    logprobs are not of the temperature-scaled distribution the trainer scores) leaves the
    decode's `logprobs` output None, and the policy loss then uses the trainer's own
    logprobs, detached: exactly on-policy for one update per batch (ratio 1, the PPO clip
    inactive). So does a loss with no old logprobs wired: under algo.rollout_correction the
    rollout's go to its `rollout_logprobs` instead (algos/updates.py one_update_logprobs)."""

    name: ClassVar[str] = "roles"

    def __init__(self, config: StepConfig, roles: Roles) -> None:
        self.config, self.roles = config, roles
        self.device = torch.device(config.device)
        self.rollout, self.reference, self.trainer = roles.rollout, roles.reference, roles.trainer
        self.values = roles.values
        st, algo = config.model.special_tokens, config.algo
        self.sampling = Sampling(
            config.max_new_tokens, algo.temperature, algo.top_p, st.eos_token_id, st.pad_token_id
        )
        self.critic = None
        self._critic_ops: frozenset[str] = frozenset()
        self._policy_scoring: frozenset[str] = frozenset()
        self._updates: dict[str, int] = {}
        self._externals: dict[str, str] = {}
        self._generator: Any = None  # a torch.Generator, or one per row (StepHooks)
        self._step = 0
        self._inputs: StepInputs | None = None
        self.metrics: dict[str, torch.Tensor] = {}
        self.role_free = RoleFreeOps(self)
        self.rollout_ops = RolloutOps(self)
        self.forwards = ForwardOps(self)
        self.sync_seconds: list[float] = []

    # -- binding ------------------------------------------------------------------------
    def check_graph(self, graph: Graph) -> None:
        """BackendError naming every op no chosen role (nor the runtime) runs."""
        missing = [
            f"{op.name} ({op.phase.value} {op.kind})"
            for op in graph
            if op.kind not in ROLE_FREE_KINDS and op.kind not in ROLE_KINDS.get(op.phase, ())
        ]
        if missing:
            raise BackendError(f"no role runs: {', '.join(missing)}")
        # A training pool (backends/fsdp/pools.py) has no rollout: it runs no rollout op.
        fused = self.rollout is not None and self.rollout.capabilities.fused_prefix
        split = [op.name for op in graph if op.kind == "prefix_prefill"]
        if fused and split:
            raise BackendError(
                f"{type(self.rollout).__name__} prefills inside its engine, but the graph "
                f"has {split}: plan it with the rollout's capabilities (planner/capabilities)"
            )

    def bind(self, graph: Graph) -> None:
        self.check_graph(graph)
        trained = {
            version_model(graph.values[op.inputs["weights"]].version)
            for op in graph
            if op.kind == "optimizer_step"
        }
        if trained - {"policy", "critic"}:
            raise BackendError(f"the roles train 'policy' and a 'critic', graph trains {trained}")
        self._critic_ops = frozenset(
            op.name
            for op in graph
            if "weights" in op.inputs
            and version_model(graph.values[op.inputs["weights"]].version) == "critic"
        )
        if self._critic_ops and self.critic is None:
            self.build_critic(f"ops {sorted(self._critic_ops)} need")
        # the policy's, and the frozen tower's when no reference model would run it
        scored = {"policy"} if self.reference is not None else {"policy", "vision"}
        self._policy_scoring = frozenset(
            op.name
            for op in graph
            if op.phase is Phase.REFERENCE
            and "weights" in op.inputs
            and version_model(graph.values[op.inputs["weights"]].version) in scored
        )
        self._externals = self.roles.externals.bind(graph)
        self.roles.hooks.bind(graph)

    def build_critic(self, needed_by: str = "a checkpoint's critic needs") -> Any:
        """The critic, built now: at the first graph that reads its weights, or earlier by a
        resume that restores into it (the graph then keeps it)."""
        if self.roles.critic_factory is None:
            raise BackendError(f"{needed_by} a critic: none built")
        self.critic = self.roles.critic_factory()
        return self.critic

    def train_micro_batches(self, count: int, recompute: bool = False, fused: bool = False) -> None:
        for owner in (self.trainer, self.critic):
            if owner is not None:
                if fused and not getattr(owner, "fused_micro_batches", True):
                    raise BackendError(
                        f"plan meta train_micro_fused: {type(owner).__name__} cannot run a "
                        "micro-batch's forward inside its backward; plan with "
                        "schedule.train_micro_recompute=true instead"
                    )
                owner.micro_batches, owner.micro_recompute = count, recompute
                owner.micro_fused = fused

    def pack_responses(self, on: bool) -> None:
        for owner in (self.trainer, self.critic, self.reference):
            if owner is not None:
                owner.packed_responses = on

    def op_micro_batches(self, counts: dict[str, int]) -> None:
        self.forwards.micro = dict(counts)

    def begin_step(self, step: int, inputs: StepInputs) -> dict[str, Any]:
        hooks = self.roles.hooks
        self.metrics, self._updates = {}, {}
        self._inputs = inputs = hooks.inputs(step, inputs)
        self._generator = hooks.generator(step, self.config.seed, self.device)
        self._step = step
        return self.roles.externals.supply(self._externals, inputs, self)

    def residency(self, action: Any) -> None:
        self.rollout_ops.residency(action)

    def end_step(self) -> dict[str, float]:
        return self.roles.hooks.metrics({k: float(v) for k, v in self.metrics.items()})

    # -- ops ----------------------------------------------------------------------------
    def run_op(
        self, op: Op, inputs: dict[str, Any], chunk: Chunk, carry: dict[str, Any]
    ) -> OpResult:
        reads = {p: w.check(op.name) for p, w in inputs.items() if hasattr(w, "check")}
        if op.kind in ("decode", "generate"):
            return OpResult(self.rollout_ops.decode(op, inputs, chunk, carry), reads)
        if chunk.count > 1 and op.kind not in PREFIX_KINDS:
            raise BackendError(f"'{op.name}' ({op.kind}) cannot run in chunks")
        if op.kind in PREFIX_KINDS:
            return self.forwards.prefix_chunk(op, inputs, chunk, carry, reads)
        if op.kind == "weight_sync":
            return OpResult(self.rollout_ops.weight_sync(op, inputs), reads)
        if op.kind in ROLE_FREE_KINDS:
            return OpResult(self.role_free.run(op, inputs), reads)
        out = self._role_op(op, inputs)
        return OpResult(out, reads, note=_trained_note(op, inputs, out))

    def update_metrics(self, kind: str, metrics: dict[str, torch.Tensor]) -> None:
        """One update's loss metrics, folded into their mean over the step's updates."""
        n = self._updates[kind] = self._updates.get(kind, 0) + 1
        for k, v in metrics.items():
            old = self.metrics.get(k)
            self.metrics[k] = v if n == 1 or old is None else old + (v - old) / n
        if kind == "policy_loss":
            self.metrics["ppo_updates"] = torch.tensor(float(n))

    def role(self, op: Op) -> Any:
        if op.name in self._critic_ops:
            return self.critic.role(train=op.phase is Phase.TRAIN)
        if op.name in self._policy_scoring:
            return self.trainer.scorer()
        role = {
            Phase.ROLLOUT: self.rollout,
            Phase.REFERENCE: self.reference,
            Phase.TRAIN: self.trainer,
            Phase.UPDATE: self.trainer,
        }.get(op.phase)
        if role is None:
            raise BackendError(f"'{op.name}' ({op.kind}) has no role in phase {op.phase.value}")
        return role

    def _role_op(self, op: Op, x: dict[str, Any]) -> dict[str, Any]:
        k, a = op.kind, op.attrs
        critic = op.name in self._critic_ops
        if k == "policy_loss":
            old = x.get("old_logprobs")
            if old is None:  # none wired, or the rollout gave none (the module docstring)
                old = _detached(x["logprobs"])
            rollout = x.get("rollout_logprobs")
            if "rollout_logprobs" in op.inputs and rollout is None:
                raise BackendError(
                    f"'{op.name}' corrects for the rollout's distribution "
                    "(algo.rollout_correction), but the rollout returned no logprobs of it"
                )
            loss = self.trainer.loss(
                x["logprobs"], old, x["advantages"], x.get("ref_logprobs"), rollout=rollout, **a
            )
            self.update_metrics(k, loss.metrics)
            return {"loss": loss}
        if k == "backward":
            owner = self.critic if critic else self.trainer
            return {"grads": owner.backward(x["loss"])}
        if k == "optimizer_step":
            owner = self.critic if critic else self.trainer
            owner.optimizer_step(x["grads"])
            if not critic and owner.lr is not None:  # the policy's (algos/lr_schedule.py)
                self.metrics["lr"] = torch.tensor(owner.lr)
            return {"weights": owner.handle(), "state": x["state"]}
        if k == "attach_prefix":
            return {"kv": self.forwards.attach_prefix(op, self.role(op), x)}
        if k == "attach_response":
            return {"logprobs": self.forwards.attach_response(op, self.role(op), x)}
        if k not in ("logprob_response", "logprob"):
            raise BackendError(f"'{op.name}' ({k}) is not a kind the roles run")
        return self.forwards.score(op, x)

    def _reward(self, responses: Any, answers: Any, group_size: int) -> torch.Tensor:
        return rewards(self, responses, answers, group_size)  # tests may patch this hook

    def generate(self, batch: PromptBatch, max_new_tokens: int, temperature: float = 0.0,
                 samples: Any = None, n: int = 1, top_p: float = 1.0):  # fmt: skip
        """`n` responses per prompt outside any plan (evaluation): rollout_ops.generate."""
        return self.rollout_ops.generate(batch, max_new_tokens, temperature, samples, n, top_p)

    # -- memory -------------------------------------------------------------------------
    def move(self, value: Any, to_host: bool, share: float = 1.0) -> Any:
        return self.values.move(value, "cpu" if to_host else self.device, share)


def _trained_note(op: Op, inputs: dict[str, Any], outputs: dict[str, Any]) -> str:
    """Where a training forward or backward skipped rows (algo.skip_zero_advantage), how
    many it trained: the plan priced every row, so the step's time is not its price."""
    value = inputs.get("loss") if op.kind == "backward" else outputs.get("logprobs")
    micro = getattr(value, "micro", None)
    if micro is None or all(micro.trained):
        return ""
    trained, rows = micro.trained_count()
    return f"trained {trained} of {rows} rows (the others' advantages are 0)"


def _detached(logprobs: Any) -> Any:
    out = type(logprobs)(logprobs.values.detach(), logprobs.mask)
    return out


__all__ = [
    "PREFIX_KINDS",
    "ROLE_FREE_KINDS",
    "RoleDispatch",
]
