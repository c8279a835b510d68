"""seq-mean-token-sum-norm in training micro-batches equals one batch: its divisor is a
constant (the padded response width), so each micro-batch's term has weight 1 and the
columns a micro-batch trims away (micro.py `trimmed`) do not change it."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.model import build_model
from rollplex.specs import AlgoSpec
from tests.backends.torch.test_micro_batches import (  # noqa: F401  (prompts: a fixture)
    _close,
    _old_and_ref,
    _rollout,
    _train,
    prompts,
)


@pytest.mark.parametrize("shared", [True, False])
def test_sum_norm_micro_batches_equal_one_batch(spec, prompts, shared):  # noqa: F811
    algo = AlgoSpec(lr=1e-2, loss_agg_mode="seq-mean-token-sum-norm")
    responses, mask, adv, gen = _rollout(spec, "grpo")
    old, ref = _old_and_ref(spec, prompts, responses, mask, gen)
    args = (spec, algo, prompts, responses, mask, adv, old, ref, shared)
    loss, grads, after, _ = _train(*args, micro=None)
    start = build_model(spec, seed=0).state_dict()
    for micro, recompute in [(2, False), (3, True)]:
        got_loss, got_grads, got_after, _ = _train(*args, micro=micro, recompute=recompute)
        assert torch.allclose(got_loss, loss, rtol=1e-5, atol=0), (micro, got_loss, loss)
        for name, g in grads.items():
            assert _close(got_grads[name], g), (micro, name)
        for name, p in after.items():
            assert _close(got_after[name] - start[name], p - start[name]), (micro, name)
