"""TorchBackend: every op kind of the GRPO graphs (deduplicated and verl-style) on
transformers modules, over the executor's environment of values.

Roles: `TorchRollout` aliases the trainer's module (colocated: `weight_sync` in alias mode
hands it the live parameters, no copy), `TorchReference` scores with a frozen copy of the
initial policy, `TorchTrainer` runs AdamW. All three keep their weights resident; a plan's
offloads move them to host and back between uses (`move`).

Chunked steps: a prefix op's chunk i of n runs rows `row_ranges(rows, n)[i]` and parks its
result in the op's carry; the last chunk concatenates them in row order. A row chunk runs
matrix products with fewer rows, which may round differently from the whole batch, so
chunked prefix results equal the unchunked ones to float rounding (tests/runtime checks
1e-5), not bit for bit. Decode segment k of n advances one `DecodeSession` by its share
of `max_new_tokens` steps, with the step's one generator: bit-identical to one decode.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from rollplex.backends.base import (
    Backend,
    BackendError,
    Chunk,
    Lifecycle,
    OpResult,
    Sampling,
)
from rollplex.backends.torch.critic import TorchCritic, build_critic_model
from rollplex.backends.torch.loss import ADVANTAGES, group_advantages
from rollplex.backends.torch.model import model_for
from rollplex.backends.torch.roles import (
    TorchReference,
    TorchRollout,
    vision_params,
    weights_params,
)
from rollplex.backends.torch.rows import (
    merge_chunks,
    move_value,
    repeat_rows,
    row_count,
    row_ranges,
    select_rows,
    text_only,
)
from rollplex.backends.torch.task import first_token_reward, reward
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.backends.torch.values import OptimizerHandle, Pixels, VersionCounter, WeightsHandle
from rollplex.data.prompts import PromptBatch
from rollplex.graph.ir import Graph, Op, Phase, ValueKind, version_model
from rollplex.specs import AlgoSpec, ModelSpec

PREFIX_KINDS = frozenset({"vision_encode", "prefix_prefill", "logprob_prefix"})


@dataclass(slots=True, frozen=True)
class TorchConfig:
    model: ModelSpec
    algo: AlgoSpec
    seed: int
    max_new_tokens: int
    reward: str = "first_token"  # token-id rewards of the built-in task (task.py)
    device: str = "cpu"
    # Scores decoded responses against their samples (rollplex.runtime.scoring); None:
    # the built-in task's token-id `reward`.
    scorer: Any = None


@dataclass(slots=True)
class StepInputs:
    """One RL step's prompts: a collated batch (pixels included) and the answer token ids."""

    batch: PromptBatch
    answers: torch.Tensor  # [B] long


def decode_seed(seed: int, step: int) -> int:
    """The decode generator's seed for RL step `step`: a function of (seed, step) only, so
    a resumed run draws the same tokens as an uninterrupted one."""
    digest = hashlib.sha256(f"rollplex-decode:{seed}:{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class TorchBackend(Backend):
    name: ClassVar[str] = "torch"
    # value_loss: the critic (critic.py) is not one of the three roles; it runs here.
    own_kinds: ClassVar[frozenset[str]] = frozenset(
        {"expand_group", "reward", "advantage", "value_loss"}
    )
    lifecycle: ClassVar[dict[str, Lifecycle]] = {
        "rollout": Lifecycle.RESIDENT,  # aliases the trainer's parameters: nothing to free
        "reference": Lifecycle.RESIDENT,
        "trainer": Lifecycle.RESIDENT,
    }

    def __init__(self, config: TorchConfig) -> None:
        self.config = config
        self.device = torch.device(config.device)
        spec = config.model
        policy, ref = (self._load(config) for _ in range(2))
        ref.requires_grad_(False)
        if not spec.trainable_vision:  # one frozen tower for all (see roles.py)
            ref.model.visual = policy.model.visual
        self.trainer = TorchTrainer(policy, spec, config.algo)
        self.reference = TorchReference(ref, config.algo.temperature)
        self.rollout = TorchRollout(spec, self.device)
        self.rollout.load_weights(self.trainer.live_weights())
        self._frozen = VersionCounter(0)
        st = spec.special_tokens
        algo = config.algo
        self.sampling = Sampling(
            config.max_new_tokens, algo.temperature, algo.top_p, st.eos_token_id, st.pad_token_id
        )
        self._externals: dict[str, str] = {}
        self._generator: torch.Generator | None = None
        self._metrics: dict[str, torch.Tensor] = {}
        self.critic: TorchCritic | None = None  # built by bind() for a graph with a critic
        self._critic_ops: frozenset[str] = frozenset()

    def _load(self, config: TorchConfig) -> torch.nn.Module:
        """The folder's weights when the spec names one (`model.path`), else random ones
        from the seed (unit tests)."""
        return model_for(config.model, config.seed, self.device)

    # -- binding ------------------------------------------------------------------------
    def bind(self, graph: Graph) -> None:
        self.check_graph(graph)
        trained = {
            version_model(graph.values[op.inputs["weights"]].version)
            for op in graph
            if op.kind == "optimizer_step"
        }
        if trained - {"policy", "critic"}:
            raise BackendError(
                f"torch backend trains 'policy' and a 'critic', graph trains {trained}"
            )
        self._bind_critic(graph)
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
                        "torch backend supplies pixels, text and answers"
                    )
            self._externals[v.name] = what

    def _bind_critic(self, graph: Graph) -> None:
        """PPO: the ops that read the critic's weights run on a critic of its own, a copy
        of the policy as it is at bind time (see critic.py)."""
        self._critic_ops = frozenset(
            op.name
            for op in graph
            if "weights" in op.inputs
            and version_model(graph.values[op.inputs["weights"]].version) == "critic"
        )
        if self._critic_ops and self.critic is None:
            c = self.config
            model = build_critic_model(self.trainer.model, c.model, c.seed)
            self.critic = TorchCritic(model, c.model, c.algo)

    def begin_step(self, step: int, inputs: StepInputs) -> dict[str, Any]:
        self._metrics = {}
        self._generator = torch.Generator(self.device).manual_seed(
            decode_seed(self.config.seed, step)
        )
        batch = inputs.batch  # host data: the executor loads it when the plan allocates it
        source = {
            "pixels": Pixels.of(batch),
            "text": text_only(batch),
            # the samples (answers as text) when a scorer grades text, else answer ids
            "answers": inputs.samples if self.config.scorer else inputs.answers,
            "policy": self.trainer.handle(),
            "ref": self._frozen_handle("ref", self.reference.model, self._ref_params),
            "vision": self._frozen_handle("vision", self.trainer.model, vision_params),
            "adam": OptimizerHandle(self.trainer.optimizer),
        }
        if self.critic is not None:
            source["critic"] = self.critic.handle()
            source["critic_adam"] = OptimizerHandle(self.critic.optimizer)
        return {name: source[what] for name, what in self._externals.items()}

    @torch.no_grad()
    def generate(self, batch: PromptBatch, max_new_tokens: int, temperature: float = 0.0):
        """One response per prompt from the rollout's current weights, outside any plan
        (evaluation): greedy by default. Returns the decode's `Generation`."""
        batch = batch.to(self.device)
        features = self.rollout.vision_encode(Pixels.of(batch))
        prefix = self.rollout.prefix_prefill(features, text_only(batch))
        st = self.config.model.special_tokens
        sampling = Sampling(max_new_tokens, temperature, 1.0, st.eos_token_id, st.pad_token_id)
        session = self.rollout.start_decode(prefix, 1, sampling, None)
        session.advance(None)
        responses, _ = session.result()
        return responses

    def _ref_params(self, model) -> tuple[torch.nn.Parameter, ...]:
        return weights_params(model, self.config.model)

    def _frozen_handle(self, name: str, model, params) -> WeightsHandle:
        return WeightsHandle(name, model, params(model), 0, self._frozen)

    def end_step(self) -> dict[str, float]:
        return {k: float(v) for k, v in self._metrics.items()}

    # -- ops ----------------------------------------------------------------------------
    def run_op(
        self, op: Op, inputs: dict[str, Any], chunk: Chunk, carry: dict[str, Any]
    ) -> OpResult:
        reads = {p: w.check(op.name) for p, w in inputs.items() if isinstance(w, WeightsHandle)}
        if op.kind == "decode":
            return OpResult(self._decode(op, inputs, chunk, carry), reads)
        if chunk.count > 1 and op.kind not in PREFIX_KINDS:
            raise BackendError(f"'{op.name}' ({op.kind}) cannot run in chunks")
        if op.kind in PREFIX_KINDS and chunk.count > 1:
            lo, hi = row_ranges(row_count(inputs), chunk.count)[chunk.index]
            x = {p: select_rows(v, lo, hi) for p, v in inputs.items()}
            carry.setdefault("parts", []).append(self._prefix(op, x, head=False))
            if not chunk.last:
                return OpResult({}, reads)
            return OpResult(merge_chunks(carry.pop("parts"), self._head(op)), reads)
        if op.kind in PREFIX_KINDS:
            return OpResult(self._prefix(op, inputs), reads)
        if op.kind == "weight_sync":
            return OpResult(self._weight_sync(op, inputs), reads)
        return OpResult(self._other(op, inputs), reads)

    def _role(self, op: Op):
        if op.name in self._critic_ops:
            return self.critic.role(train=op.phase is Phase.TRAIN)
        return {
            Phase.ROLLOUT: self.rollout,
            Phase.REFERENCE: self.reference,
            Phase.TRAIN: self.trainer,
        }.get(op.phase) or _fail(op, "has no role in its phase")

    def _head(self, op: Op) -> torch.nn.Module:
        role = self._role(op)
        return role.head() if role is self.rollout else role.model.lm_head

    def _prefix(self, op: Op, x: dict[str, Any], head: bool = True) -> dict[str, Any]:
        """`head=False` (row chunks): leave the LM head to the merge of all chunks."""
        role = self._role(op)
        if op.kind == "vision_encode":
            return {"features": role.vision_encode(x["pixels"])}
        if op.kind == "prefix_prefill":
            self._check_rollout(op, x["weights"])
            return {"kv": role.prefix_prefill(x["features"], x["text"], head=head)}
        out = role.logprob_prefix(x["features"], x["text"], head=head)
        if op.phase is Phase.TRAIN:
            return {"kv": out[0], "saved": out[1]} if "saved" in op.outputs else {"kv": out[0]}
        return {"kv": out}

    def _check_rollout(self, op: Op, weights: WeightsHandle) -> None:
        if self.rollout.weights_version != weights.name:
            raise BackendError(
                f"'{op.name}' reads {weights.name} but the rollout holds "
                f"{self.rollout.weights_version}: a weight_sync is missing"
            )

    def _decode(self, op: Op, x: dict[str, Any], chunk: Chunk, carry: dict[str, Any]):
        self._check_rollout(op, x["weights"])
        if chunk.index == 0:
            carry["session"] = self.rollout.start_decode(
                x["kv"], op.attrs["group_size"], self.sampling, self._generator
            )
        session = carry.get("session") or _fail(op, f"segment {chunk.index} has no session")
        r = self.sampling.max_new_tokens
        share = r * (chunk.index + 1) // chunk.count - r * chunk.index // chunk.count
        session.advance(None if chunk.last else share)
        if not chunk.last:
            return {}
        responses, logprobs = carry.pop("session").result()
        self._metrics["response_length"] = responses.lengths.float().mean()
        return {"responses": responses, "logprobs": logprobs}

    def _weight_sync(self, op: Op, x: dict[str, Any]) -> dict[str, Any]:
        if op.attrs.get("mode", "alias") != "alias":
            _fail(op, f"mode {op.attrs['mode']!r}: the torch backend syncs by alias only")
        w: WeightsHandle = x["weights"]
        self.rollout.load_weights(self.trainer.live_weights())
        return {"weights": w}

    def _other(self, op: Op, x: dict[str, Any]) -> dict[str, Any]:
        k, a = op.kind, op.attrs
        if k == "expand_group":
            return {"y": repeat_rows(x["x"], a["group_size"])}
        if k == "reward":
            return {"rewards": self._reward(x["responses"], x["answers"], a["group_size"])}
        if (k == "value_loss" or a.get("estimator") == "gae") and self.critic is None:
            _fail(op, "needs a critic: no op of this graph reads critic weights")
        if k == "advantage" and a.get("estimator") == "gae":
            kl = None
            if "ref_logprobs" in x:
                kl = (x["old_logprobs"], x["ref_logprobs"], a["kl_coef"])
            adv, returns = self.critic.advantages(
                x["rewards"], x["values"], a["gamma"], a["lam"], kl
            )
            return {"advantages": adv, "returns": returns}
        if k == "value_loss":
            loss = self.critic.loss(
                x["values"], x["returns"], x.get("old_values"), a.get("clip_eps", 0.5)
            )
            self._metrics.update(loss.metrics)
            return {"loss": loss}
        if k == "backward" and op.name in self._critic_ops:
            return {"grads": self.critic.backward(x["loss"])}
        if k == "optimizer_step" and op.name in self._critic_ops:
            self.critic.optimizer_step(x["grads"])
            return {"weights": self.critic.handle(), "state": x["state"]}
        if k == "advantage":
            estimator = ADVANTAGES.get(a.get("estimator", "grpo"))
            if estimator is None:
                _fail(op, f"estimator {a['estimator']!r}: only {sorted(ADVANTAGES)} run here")
            if estimator is group_advantages:
                adv = estimator(
                    x["rewards"],
                    a["group_size"],
                    norm_by_std=self.config.algo.norm_adv_by_std_in_grpo,
                )
            else:
                adv = estimator(x["rewards"], a["group_size"])
            return {"advantages": adv}
        if k == "policy_loss":
            loss = self.trainer.loss(
                x["logprobs"], x["old_logprobs"], x["advantages"], x.get("ref_logprobs"), **a
            )
            self._metrics.update(loss.metrics)
            return {"loss": loss}
        if k == "backward":
            return {"grads": self.trainer.backward(x["loss"])}
        if k == "optimizer_step":
            self.trainer.optimizer_step(x["grads"])
            return {"weights": self.trainer.handle(), "state": x["state"]}
        role = self._role(op)
        if k == "logprob_response":
            out = role.logprob_response(x["kv"], x["responses"], a.get("group_size", 1))
        elif k == "logprob":
            out = role.logprob(x["features"], x["text"], x["responses"])
        else:
            _fail(op, "is not a kind this backend runs")
        if op.phase is Phase.TRAIN:
            return (
                {"logprobs": out[0], "saved": out[1]}
                if "saved" in op.outputs
                else {"logprobs": out[0]}
            )
        return {"logprobs": out}

    def _reward(self, responses, answers: Any, group_size: int) -> torch.Tensor:
        if self.config.scorer is not None:
            scored = self.config.scorer(
                responses.tokens.tolist(), responses.lengths.tolist(), answers, group_size
            )
            self._metrics.update({k: torch.tensor(v) for k, v in scored.metrics.items()})
            out = torch.tensor(scored.rewards, dtype=torch.float32, device=responses.tokens.device)
            self._metrics["reward"] = out.mean()
            return out
        eos = self.sampling.eos_id
        per_sample = answers.repeat_interleave(group_size).tolist()
        rows = responses.tokens.tolist()
        if self.config.reward == "first_token":
            r = [first_token_reward(t, a) for t, a in zip(rows, per_sample, strict=True)]
        else:
            r = [reward(t, a, eos) for t, a in zip(rows, per_sample, strict=True)]
        out = torch.tensor(r, dtype=torch.float32, device=responses.tokens.device)
        self._metrics["reward"] = out.mean()
        return out

    # -- memory -------------------------------------------------------------------------
    def move(self, value: Any, to_host: bool) -> Any:
        target = torch.device("cpu") if to_host else self.device
        return move_value(value, target)


def _fail(op: Op, why: str):
    raise BackendError(f"'{op.name}' ({op.kind}) {why}")
