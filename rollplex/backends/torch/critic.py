"""PPO's critic on transformers modules: a copy of the policy whose `lm_head` is replaced by
`Linear(hidden, 1)`, trained by its own AdamW; GAE over the rollout's rewards.

The policy's logprob path then works unchanged for values (prefix sharing, row chunks,
response forward); value j is read where logprob j is, as verl's critic does. `CriticRole`
is its forward without grad (reference phase) and with grad (training phase).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from rollplex.backends.base import BackendError
from rollplex.backends.torch.exported_prefix import ExportedPrefix, prefill_exported
from rollplex.backends.torch.full_forward import features_full_head_outputs
from rollplex.backends.torch.handles import GradsHandle, VersionCounter, WeightsHandle
from rollplex.backends.torch.host_memory import forget_tags
from rollplex.backends.torch.logprob import response_head_outputs, response_mask
from rollplex.backends.torch.loss import (
    Total,
    gae,
    kl_penalized_rewards,
    token_rewards,
    value_loss,
)
from rollplex.backends.torch.masters import (
    Masters,
    StateMismatch,
    _few,
    adamw_over,
    check_optimizer_state,
    clear_grads,
    clipped_step,
)
from rollplex.backends.torch.micro import response_micro_batches, sample_micro_batches
from rollplex.backends.torch.micro_loss import backward_loss, micro_loss
from rollplex.backends.torch.roles import (
    features_of,
    freeze_for_graph,
    masked_logprobs,
    weights_params,
)
from rollplex.backends.torch.rows import merge_chunks
from rollplex.backends.torch.training_prefix import attached_with_grad, prefix_with_grad
from rollplex.backends.torch.trim import trimmed
from rollplex.backends.torch.values import Features, Loss, Pixels, Responses, TokenLogprobs
from rollplex.data.prompts import PromptBatch
from rollplex.engine.prefix import Model, PrefixState, prefix_forward
from rollplex.specs import AlgoSpec, ModelSpec


def build_critic_model(policy: Model, spec: ModelSpec, seed: int) -> Model:
    """A copy of `policy` with a value head: Linear(hidden, 1), weight ~ N(0, 0.02^2) drawn
    from `seed`, bias 0 (a fresh head, as a token-classification model gets)."""
    critic = copy.deepcopy(policy)
    if not spec.trainable_vision:
        critic.model.visual = policy.model.visual  # one frozen tower for all
    ref = policy.lm_head.weight
    head = nn.Linear(ref.shape[1], 1, bias=True)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * 0.02)
        head.bias.zero_()
    critic.lm_head = head.to(device=ref.device, dtype=ref.dtype)
    return critic


def _values(first: torch.Tensor, rest: torch.Tensor | None) -> torch.Tensor:
    parts = [first.float()] + ([rest.squeeze(-1).float()] if rest is not None else [])
    return torch.cat(parts, 1)


def _masked(values: torch.Tensor, responses: Responses) -> TokenLogprobs:
    """Values [S, R] with 0 past each response's end (TokenLogprobs holds any per-token
    quantity with its mask)."""
    out = masked_logprobs(values, responses)
    out.values = torch.where(out.mask, out.values, 0.0)
    return out


class TorchCritic:
    """The critic's model, optimizer and version; `role(train)` gives the forward."""

    def __init__(self, model: Model, spec: ModelSpec, algo: AlgoSpec, version: int = 0) -> None:
        self.model, self.spec, self.algo = model, spec, algo
        freeze_for_graph(model, spec)
        self.named = tuple((n, p) for n, p in model.named_parameters() if p.requires_grad)
        self.params = tuple(p for _, p in self.named)
        # a bf16/fp16 critic trains through float32 masters, as the policy does (masters.py)
        self.masters, self.optimizer = adamw_over(
            self.named,
            lr=algo.critic_lr,
            betas=tuple(algo.adam_betas),
            weight_decay=algo.weight_decay,
        )
        self.counter = VersionCounter(version)
        self.micro_batches = 1  # the plan's training micro-batches (runtime/dispatch.py)
        self.micro_recompute = False  # and whether each forward runs again in the backward
        # fused (verl's forward and backward per micro-batch): the critic runs it as
        # recompute, a forward more than planned, since its values may be read elsewhere
        self.micro_fused = False
        # sums over the data-parallel ranks holding the batch's other rows (the FSDP2
        # critic), so GAE whitens over the whole batch; None: this process holds it all
        self.batch_total: Total | None = None
        self.packed_responses = True  # response forwards on the real tokens (dispatch.py)
        self.scorer, self.trainer = CriticRole(self, train=False), CriticRole(self, train=True)

    def role(self, train: bool) -> CriticRole:
        return self.trainer if train else self.scorer

    def handle(self) -> WeightsHandle:
        params = weights_params(self.model, self.spec)
        return WeightsHandle("critic", self.model, params, self.counter.n, self.counter)

    def advantages(
        self,
        rewards: torch.Tensor,
        old_values: TokenLogprobs,
        gamma: float,
        lam: float,
        kl: tuple | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE with the sequence reward on each response's last valid token: (whitened
        advantages [S, R], returns [S, R]). `kl=(old, ref, coef[, estimator])` first
        subtracts coef * KL(old, ref) from every token's reward (verl's apply_kl_penalty;
        the estimator is its kl_penalty, 'kl' = old - ref unless given)."""
        scores = token_rewards(rewards, old_values.mask)
        if kl is not None:
            estimator = kl[3] if len(kl) > 3 else "kl"
            scores = kl_penalized_rewards(
                scores, kl[0].values, kl[1].values, old_values.mask, kl[2], estimator
            )
        values = old_values.values.detach()
        return gae(scores, values, old_values.mask, gamma, lam, self.batch_total)

    def loss(
        self, values: TokenLogprobs, returns: torch.Tensor, old: TokenLogprobs | None, clip: float
    ) -> Loss:
        """verl's clipped value loss; without old values the clip has nothing to centre on,
        so it is the plain 0.5 (v - R)^2. Micro-batched values give one weighted term per
        micro-batch (see the trainer's loss)."""
        old_values = old.values.detach() if old is not None else values.values.detach()
        mode = self.algo.loss_agg_mode
        c = clip if old is not None else float("inf")

        def run(v: torch.Tensor, rows: slice):
            return value_loss(v, returns[rows], old_values[rows], values.mask[rows], c, mode)

        return micro_loss(run, values, mode)

    def backward(self, loss: Loss) -> GradsHandle:
        clear_grads(self.optimizer, self.masters, self.params)
        backward_loss(loss)
        return GradsHandle(self.params)

    def optimizer_step(self, grads: GradsHandle) -> int:
        if grads.params is not self.params:
            raise BackendError("the critic's optimizer_step got gradients of other parameters")
        clipped_step(self.optimizer, self.masters, self.params, self.algo.max_grad_norm)
        self.counter.n += 1
        return self.counter.n

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the critic: "weights", its trained parameters (the
        trunk copy and the value head; a frozen vision tower is the policy's), its AdamW
        "optimizer" state (each parameter's step count, moments), its "version" (optimizer
        steps taken) and, for a bf16/fp16 critic, its float32 "masters"."""
        out: dict[str, Any] = {
            "weights": {n: p.detach().cpu().contiguous() for n, p in self.named},
            "optimizer": self.optimizer.state_dict(),
            "version": self.counter.n,
        }
        if self.masters is not None:
            out["masters"] = self.masters.state_dict()
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """`state_dict`'s output into this critic, everything checked before anything
        changes, as the trainer's load is; StateMismatch (part "weights", "optimizer" or
        "masters") names what does not fit. Without "masters" they start from the weights."""
        weights, masters = state["weights"], state.get("masters")
        _check_weights(weights, self.named)
        if masters is not None:  # they must round to the saved weights
            Masters.check(masters, self.masters, [(n, weights[n]) for n, _ in self.named])
        check_optimizer_state(state["optimizer"], self.optimizer, [n for n, _ in self.named])
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except ValueError as e:  # torch's own group-size checks
            raise StateMismatch("optimizer", str(e)) from e
        with torch.no_grad():
            for n, p in self.named:
                p.copy_(weights[n])  # in place: the critic's handles alias them
        if masters is not None:
            Masters.load(masters, self.masters, self.named)
        elif self.masters is not None:
            self.masters.assign(dict(self.named))
        self.counter.n = int(state["version"])
        forget_tags(self.model.parameters())  # a version number this process may have seen


def _check_weights(saved: Mapping[str, Any], named: tuple[tuple[str, nn.Parameter], ...]) -> None:
    """StateMismatch("weights") unless `saved` holds a tensor of the right shape for exactly
    the critic's trained parameters."""
    shapes = {n: p.shape for n, p in named}
    if missing := sorted(set(shapes) - set(saved)):
        raise StateMismatch("weights", f"no weight for {_few(missing)}")
    if extra := sorted(set(saved) - set(shapes)):
        raise StateMismatch("weights", f"weights of no trained parameter: {_few(extra)}")
    for n, shape in shapes.items():
        t = saved[n]
        if not isinstance(t, torch.Tensor) or t.shape != shape:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise StateMismatch("weights", f"{n}: {got}, the parameter's {tuple(shape)}")


class CriticRole:
    """The critic's forward in one mode: `train=False` returns values like the reference
    returns logprobs, `train=True` also returns what autograd saved, like the trainer."""

    def __init__(self, critic: TorchCritic, train: bool) -> None:
        self.critic, self.train = critic, train

    @property
    def model(self) -> Model:
        return self.critic.model

    def merge_rows(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        return merge_chunks(parts, self.model.lm_head)

    def vision_encode(self, pixels: Pixels) -> Features:
        with torch.set_grad_enabled(self.train and self.critic.spec.trainable_vision):
            return features_of(self.model, pixels)

    def logprob_prefix(self, features: Features, text: PromptBatch, head: bool = True):
        """Training: as the policy's, one piece of the prefix (prefix_pieces.py)."""
        if self.train:
            return prefix_with_grad(self.model, features.values, text, head)
        return prefix_forward(self.model, text, features.values, grad=False, head=head)

    def logprob_prefix_exported(
        self, features: Features, text: PromptBatch
    ) -> tuple[PrefixState, ExportedPrefix]:
        """The no-grad prefix forward (old values) that also keeps what the training
        prefix forward at these weights would (prefill_once, exported_prefix.py)."""
        version = self.critic.handle().name
        return prefill_exported(self.model, features.values, text, version)

    def attach_exported(self, exported: ExportedPrefix, features: Features, head: bool = True):
        """The training prefix from `logprob_prefix_exported`'s export (the caller checked
        the version): each layer recomputed from its kept input in the backward."""
        if not self.train or exported.ridden is None:
            raise BackendError("the critic attaches a live export in training only")
        count = self.critic.micro_batches
        return attached_with_grad(self.model, exported.ridden, features.values, head, count)

    def logprob_response(self, prefix: PrefixState, responses: Responses, group_size: int):
        packed = self.critic.packed_responses
        if self.train:  # in the plan's micro-batches of prompts' groups, as the trainer

            def score(state: PrefixState, tokens, lengths, _rows: slice) -> torch.Tensor:
                out = response_head_outputs(self.model, state, tokens, lengths, packed=packed)
                mask = response_mask(lengths, tokens.shape[1])  # its trimmed columns
                return torch.where(mask, _values(*out), 0.0)

            return response_micro_batches(
                self.model,
                prefix,
                responses,
                group_size,
                self.critic.micro_batches,
                score,
                self.critic.micro_recompute or self.critic.micro_fused,
            )
        lengths = responses.lengths

        def values(tokens: torch.Tensor) -> torch.Tensor:
            return _values(
                *response_head_outputs(self.model, prefix, tokens, lengths, group_size, packed)
            )

        with torch.no_grad():  # each prompt's G responses share its prefix K/V (no expand)
            return _masked(trimmed(values, responses.tokens, lengths), responses)

    def logprob(self, features: Features, text: PromptBatch, responses: Responses):
        packed = self.critic.packed_responses
        if self.train:  # in the plan's micro-batches of samples

            def score(text, visual, tokens, lengths, _rows: slice) -> torch.Tensor:
                out = features_full_head_outputs(self.model, text, visual, tokens, lengths, packed)
                mask = response_mask(lengths, tokens.shape[1])  # its trimmed columns
                return torch.where(mask, out.squeeze(-1).float(), 0.0)

            return sample_micro_batches(
                self.model,
                features,
                text,
                responses,
                self.critic.micro_batches,
                score,
                self.critic.micro_recompute or self.critic.micro_fused,
            )
        lengths = responses.lengths

        def values(tokens: torch.Tensor) -> torch.Tensor:
            out = features_full_head_outputs(
                self.model, text, features.values, tokens, lengths, packed
            )
            return out.squeeze(-1).float()

        with torch.no_grad():  # to the rows' longest response, not the cap
            return _masked(trimmed(values, responses.tokens, lengths), responses)
