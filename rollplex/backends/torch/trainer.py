"""The trainer role: logprobs with grad (at the rollout temperature), the policy loss with
AlgoSpec's settings, backward and AdamW in place.

Forward, loss and backward run in the plan's micro-batches (micro.py), every decoder layer
checkpointed, then one optimizer step. A bf16/fp16 model trains through float32 master
weights (masters.py), as the planner prices it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from rollplex.algos.lr_schedule import lr_at
from rollplex.backends.base import BackendError, LiveWeights, Trainer
from rollplex.backends.torch.activations import SavedActivations
from rollplex.backends.torch.decoded_response import decoded_response_logprobs
from rollplex.backends.torch.exported_prefix import ExportedPrefix
from rollplex.backends.torch.full_forward import features_full_logprobs
from rollplex.backends.torch.handles import GradsHandle, VersionCounter, WeightsHandle
from rollplex.backends.torch.host_memory import forget_tags
from rollplex.backends.torch.logprob import entropy_mode, response_logprobs
from rollplex.backends.torch.loss import loss_options, policy_loss
from rollplex.backends.torch.masters import (
    Masters,
    StateMismatch,
    adamw_over,
    check_optimizer_state,
    clear_grads,
    clipped_step,
    own_masters,
)
from rollplex.backends.torch.micro import response_micro_batches, sample_micro_batches
from rollplex.backends.torch.micro_loss import backward_loss, micro_loss
from rollplex.backends.torch.model import load_model, save_model
from rollplex.backends.torch.policy_scorer import PolicyScorer
from rollplex.backends.torch.roles import (
    features_of,
    freeze_for_graph,
    weights_params,
)
from rollplex.backends.torch.rollout_correction import Correction
from rollplex.backends.torch.row_ranges import live_prompts
from rollplex.backends.torch.rows import merge_chunks
from rollplex.backends.torch.training_prefix import (
    attached_with_grad,
    live_features,
    live_prefix_with_grad,
    prefix_with_grad,
)
from rollplex.backends.torch.values import Features, Loss, Pixels, Responses, TokenLogprobs
from rollplex.data.prompts import PromptBatch
from rollplex.engine.decoded import DecodedOutputs
from rollplex.engine.prefix import Model, PrefixState
from rollplex.engine.riders import RiddenPrefix, RiderRows, rider_rows
from rollplex.specs import AlgoSpec, ModelSpec
from rollplex.specs.roles import TORCH_SCORER, RoleCapabilities

log = logging.getLogger(__name__)


class TorchTrainer(Trainer):
    """AdamW on the graph's trained parameters, clipped to `algo.max_grad_norm`."""

    capabilities: ClassVar[RoleCapabilities] = TORCH_SCORER

    def __init__(self, model: Model, spec: ModelSpec, algo: AlgoSpec, version: int = 0) -> None:
        self.model, self.spec, self.algo = model, spec, algo
        freeze_for_graph(model, spec)
        self.named = tuple((n, p) for n, p in model.named_parameters() if p.requires_grad)
        self.params = tuple(p for _, p in self.named)
        # None for a float32 model: AdamW then runs on the parameters themselves
        self.masters, self.optimizer = adamw_over(
            self.named, lr=algo.lr, betas=tuple(algo.adam_betas), weight_decay=algo.weight_decay
        )
        self.counter = VersionCounter(version)
        self.lr = algo.lr  # the last update's (algos/lr_schedule.py)
        self._scorer: PolicyScorer | None = None

    def master_tensors(self) -> tuple[torch.Tensor, ...]:
        """The float32 masters of their own (none for a float32 model): optimizer state,
        offloaded and onloaded with the moments."""
        return own_masters(self.masters)

    def handle(self) -> WeightsHandle:
        return WeightsHandle(
            "policy",
            self.model,
            weights_params(self.model, self.spec),
            self.counter.n,
            self.counter,
        )

    def merge_rows(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        return merge_chunks(parts, self.model.lm_head)

    def live_weights(self) -> LiveWeights:
        return LiveWeights(self.handle(), "policy", self.counter.n)

    def vision_encode(self, pixels: Pixels, advantages: torch.Tensor | None = None) -> Features:
        """The prompts' visual features; with `advantages`, only those of the prompts
        whose groups train (their prefix alone reads them: graph/passes/skip_dead_prefix.py)."""
        with torch.set_grad_enabled(self.spec.trainable_vision):
            if advantages is None:
                return features_of(self.model, pixels)
            live = live_prompts(advantages, pixels.rows)
            return live_features(self.model, pixels, live)

    def logprob_prefix(
        self,
        features: Features,
        text: PromptBatch,
        head: bool = True,
        advantages: torch.Tensor | None = None,
    ) -> tuple[PrefixState, SavedActivations]:
        """The prefix forward with grad, each decoder layer checkpointed, as one piece
        (prefix_pieces.py: its micro-batches read it through leaves; the plan's
        micro-batches of this op are its pieces). With `advantages`, only the prompts whose
        groups train run it (graph/passes/skip_dead_prefix.py; training_prefix.py)."""
        if advantages is None:
            return prefix_with_grad(self.model, features.values, text, head)
        live = live_prompts(advantages, text.size)
        return live_prefix_with_grad(self.model, features, text, head, live)

    def scorer(self) -> PolicyScorer:
        """This model scored without grad (its live weights, the rollout's temperature):
        the old-logprob forward of PPO mini-batches, before the first update."""
        if self._scorer is None:
            self._scorer = PolicyScorer(self.model, self.algo.temperature)
        self._scorer.packed_responses = self.packed_responses
        return self._scorer

    def ride_rows(self, features: Features, text: PromptBatch) -> RiderRows:
        """The prefix rows of `logprob_prefix`, to ride a decode step (engine/riders.py)."""
        return rider_rows(self.model, text, features.values.detach())

    def attach_ridden(
        self,
        ridden: RiddenPrefix,
        features: Features,
        head: bool = True,
        micro_batches: int | None = None,
        live: list[bool] | None = None,
    ) -> tuple[PrefixState, SavedActivations]:
        """`logprob_prefix`'s result from a ride: its backward recomputes each layer from
        the input the ride kept, as `logprob_prefix`'s checkpointed layers do, in
        `micro_batches` ranges of its rows (None: the trainer's count; a row chunk is one);
        with `live` (per prompt), only the live prompts' (training_prefix.py)."""
        count = self.micro_batches if micro_batches is None else micro_batches
        return attached_with_grad(self.model, ridden, features.values, head, count, live)

    def attach_exported(
        self,
        exported: ExportedPrefix,
        features: Features,
        head: bool = True,
        advantages: torch.Tensor | None = None,
    ) -> tuple[PrefixState, SavedActivations]:
        """`logprob_prefix`'s result from the rollout's exported prefill (prefill_once);
        the caller has checked it was computed with this trainer's weights version. With
        `advantages`, the backward replays only the prompts whose groups train (row_ranges.py)."""
        if exported.ridden is None:
            raise BackendError("the exported prefill was already released")
        prompts = exported.ridden.rows.batch.size
        live = None if advantages is None else live_prompts(advantages, prompts)
        return self.attach_ridden(exported.ridden, features, head, live=live)

    def logprob_response(
        self,
        prefix: PrefixState,
        responses: Responses,
        group_size: int,
        advantages: torch.Tensor | None = None,
    ) -> tuple[TokenLogprobs, SavedActivations]:
        """Response logprobs in micro-batches of whole prompts' groups, with the policy's
        entropy beside them (with grad only when the loss has an entropy term); with
        `advantages`, the groups whose advantages are all 0 run nothing (row_ranges.py)."""
        return self._response(prefix, responses, group_size, None, advantages)

    def attach_decoded(
        self,
        prefix: PrefixState,
        responses: Responses,
        group_size: int,
        kept: DecodedOutputs,
        advantages: torch.Tensor | None = None,
    ) -> tuple[TokenLogprobs, SavedActivations]:
        """`logprob_response`'s result from the decode that drew `responses`, its kept layer
        outputs in place of the response forward (decode once, decoded_response.py); the
        caller has checked it was decoded with this trainer's weights version."""
        try:
            layers = kept.layers()
        except RuntimeError as e:
            raise BackendError(str(e)) from e
        if layers.shape[1] != responses.tokens.shape[0]:
            raise BackendError(
                f"the decode kept {layers.shape[1]} rows for {responses.tokens.shape[0]} responses"
            )
        return self._response(prefix, responses, group_size, layers, advantages)

    def _response(
        self,
        prefix: PrefixState,
        responses: Responses,
        group_size: int,
        kept: torch.Tensor | None,
        advantages: torch.Tensor | None,
    ) -> tuple[TokenLogprobs, SavedActivations]:
        ent, t = entropy_mode(self.algo.entropy_coeff), self.algo.temperature
        packed = self.packed_responses

        def score(state: PrefixState, tokens, lengths, rows: slice):
            if kept is None:
                return response_logprobs(
                    self.model, state, tokens, lengths, t, entropy=ent, packed=packed
                )
            mine = kept[:, rows]
            return decoded_response_logprobs(
                self.model, state, tokens, lengths, mine, t, ent, packed
            )

        return response_micro_batches(
            self.model,
            prefix,
            responses,
            group_size,
            self.micro_batches,
            score,
            self.micro_recompute,
            self.micro_fused,
            entropy=True,
            advantages=advantages,
        )

    def logprob(
        self,
        features: Features,
        text: PromptBatch,
        responses: Responses,
        advantages: torch.Tensor | None = None,
    ) -> tuple[TokenLogprobs, SavedActivations]:
        """The per-sample forward (verl's) in micro-batches of whole samples, with the
        policy's entropy as in logprob_response; with `advantages`, the samples whose
        advantage is 0 run nothing."""
        ent = entropy_mode(self.algo.entropy_coeff)

        def score(text, visual, tokens, lengths, _rows: slice):
            t, packed = self.algo.temperature, self.packed_responses
            return features_full_logprobs(self.model, text, visual, tokens, lengths, t, ent, packed)

        return sample_micro_batches(
            self.model,
            features,
            text,
            responses,
            self.micro_batches,
            score,
            self.micro_recompute,
            self.micro_fused,
            entropy=True,
            advantages=advantages,
        )

    def loss(
        self,
        logprobs: TokenLogprobs,
        old: TokenLogprobs,
        advantages: torch.Tensor,
        ref: TokenLogprobs | None,
        clip_eps: float = 0.2,
        kl_coef: float = 0.0,
        *,
        rollout: TokenLogprobs | None = None,
        **_: Any,
    ) -> Loss:
        """The op's attrs give clip_eps and kl_coef (the graph's); the other settings are
        AlgoSpec's (see specs/algo.py). Micro-batched logprobs give one term per
        micro-batch, weighted so that they sum to the whole batch's loss; the value and
        metrics are the whole batch's. Logprobs that carry the entropy (the training
        forward's) give the `entropy` metric and the entropy_coeff term. `rollout` (the
        engine's logprobs) brings algo.rollout_correction's weights and rejection."""
        a = self.algo
        ref_values = ref.values if ref is not None else logprobs.values.detach()
        correction = self.correction(logprobs, old, rollout)
        mask = logprobs.mask if correction is None else correction.keep

        def run(lp: torch.Tensor, rows: slice, entropy: torch.Tensor | None = None):
            weights, extra = correction.rows(rows) if correction else (None, {})
            loss, metrics = policy_loss(
                lp,
                old.values[rows],
                ref_values[rows],
                advantages[rows],
                mask[rows],
                clip_eps,
                kl_coef if ref is not None else 0.0,
                entropy=entropy,
                is_weights=weights,
                **loss_options(a),
            )
            return loss, metrics | extra

        return self.batch_loss(micro_loss(run, logprobs, a.loss_agg_mode, mask), mask)

    def batch_loss(self, loss: Loss, mask: torch.Tensor) -> Loss:
        """This process's loss over the tokens of `mask` as the step's: itself here; a
        data-parallel trainer rescales it to its share of the global batch."""
        return loss

    def correction(
        self, logprobs: TokenLogprobs, old: TokenLogprobs, rollout: TokenLogprobs | None
    ) -> Correction | None:
        """algo.rollout_correction over this loss's batch, or None where it is off."""
        spec = self.algo.rollout_correction
        if rollout is None or not spec.enabled:
            return None
        return Correction.of(spec, old.values, rollout.values, logprobs.mask)

    def backward(self, loss: Loss) -> GradsHandle:
        clear_grads(self.optimizer, self.masters, self.params)
        backward_loss(loss)
        if loss.micro is not None and not all(loss.micro.trained):
            # rows went untrained (their gradient is 0): where none trained, no backward
            # reached a parameter, and AdamW skips a None grad, but would step a 0 one
            # (moments, weight decay) as the full batch's backward gives it
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        return GradsHandle(self.params)

    def optimizer_step(self, grads: GradsHandle) -> int:
        if grads.params is not self.params:
            raise BackendError("optimizer_step got gradients of other parameters")
        self.lr = lr_at(self.algo, self.counter.n)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        clipped_step(self.optimizer, self.masters, self.params, self.algo.max_grad_norm)
        self.counter.n += 1
        return self.counter.n

    def state_dict(self) -> dict[str, Any]:
        """The optimizer state and version; with "masters" (name -> float32 tensor) for a
        model trained through masters."""
        out: dict[str, Any] = {"optimizer": self.optimizer.state_dict(), "version": self.counter.n}
        if self.masters is not None:
            out["masters"] = self.masters.state_dict()
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Everything is checked before anything changes. A state without "masters" (an
        older or a float32 run's) keeps the masters taken from the weights; masters given to
        a float32 model become its weights (they are the exact values the weights round).
        StateMismatch (part "masters" or "optimizer") names what does not fit."""
        masters = state.get("masters")
        if masters is not None:
            Masters.check(masters, self.masters, self.named)
        elif self.masters is not None:
            log.info("no master weights in the trainer state: they start from the weights")
        check_optimizer_state(state["optimizer"], self.optimizer, [n for n, _ in self.named])
        try:
            self.optimizer.load_state_dict(state["optimizer"])
        except ValueError as e:  # torch's own group-size checks
            raise StateMismatch("optimizer", str(e)) from e
        if masters is not None:
            Masters.load(masters, self.masters, self.named)
        self.counter.n = int(state["version"])
        forget_tags(self.model.parameters())  # a version number this process may have seen

    def save_weights(self, folder: Path) -> None:
        save_model(self.model, self.spec, folder)

    def load_weights(self, folder: Path) -> None:
        """Copy a model folder's weights into the live parameters (aliases stay valid)."""
        loaded = load_model(folder, spec=self.spec)
        with torch.no_grad():
            for (name, p), (other, q) in zip(
                self.model.named_parameters(), loaded.named_parameters(), strict=True
            ):
                if name != other or p.shape != q.shape:
                    raise BackendError(f"{folder}: parameter {other} does not match {name}")
                p.copy_(q)
        forget_tags(self.model.parameters())  # same version, new values
        if self.masters is not None:  # the next step starts from these weights
            self.masters.assign(dict(loaded.named_parameters()))
