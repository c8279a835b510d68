"""The trained model scored without grad: the old-logprob forward of PPO mini-batches (and
of rollout rejection), at its live weights and the rollout's temperature. It reads the
decode's weights version, so its prefix rows may ride a decode step as the trainer's do."""

from __future__ import annotations

import torch

from rollplex.backends.torch.roles import TorchReference
from rollplex.backends.torch.values import Features
from rollplex.data.prompts import PromptBatch
from rollplex.engine.prefix import PrefixState, cache_kv, fork_cache
from rollplex.engine.riders import RiddenPrefix, RiderRows, attach, rider_rows
from rollplex.engine.step import rotary_fn


class PolicyScorer(TorchReference):
    """The trained model scored without grad. It reads the decode's weights version, so
    its prefix rows may ride a decode step as the trainer's do; the result is detached."""

    def ride_rows(self, features: Features, text: PromptBatch) -> RiderRows:
        return rider_rows(self.model, text, features.values.detach())

    def attach_ridden(
        self,
        ridden: RiddenPrefix,
        features: Features,
        head: bool = True,
        micro_batches: int | None = None,
    ) -> tuple[PrefixState, None]:  # no grad: no backward to cut
        rotary = rotary_fn(self.model.model.language_model.layers[0].self_attn)
        state = attach(self.model, rotary, ridden, features.values.detach(), head)
        kv = [(k.detach(), v.detach()) for k, v in cache_kv(state.cache)]

        def off(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.detach()

        detached = PrefixState(
            fork_cache(kv),
            off(state.last_logits),
            state.attention_mask,
            state.next_positions,
            state.rope_deltas,
            state.lengths,
            state.group_size,
            off(state.last_hidden),
        )
        return detached, None
