"""algo.rollout_correction in the trainer: its loss over micro-batches (kept, recomputed, fused)
equals one plain forward's loss over the kept tokens with the truncated weights, in value
and in every gradient, for verl's per-sample forward and the shared prefix. The rejection
is decided over the whole batch before any micro-batch runs, so each term is weighted by
the tokens the batch keeps."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.loss import policy_loss
from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.roles import freeze_for_graph
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.backends.torch.values import TokenLogprobs
from rollplex.specs import AlgoSpec
from tests.backends.torch.test_micro_batches import (
    CLIP,
    KL,
    _close,
    _old_and_ref,
    _reference,
    _rollout,
    prompts,  # noqa: F401 (the fixture)
    trainer_logprobs,
)

UPPER, CAP = 1.6, 1.5


def _expected(old, roll, mask):
    """Independently of rollout_correction.py: token IS weights min(e^(old - roll), CAP),
    and the tokens of responses whose geometric-mean ratio is within [1/UPPER, UPPER]."""
    d = torch.where(mask, old - roll, 0.0)
    geo = torch.exp(d.sum(-1) / mask.sum(-1).clamp(min=1))
    keep = mask & ((geo >= 1 / UPPER) & (geo <= UPPER))[:, None]
    return torch.where(mask, torch.exp(d).clamp(max=CAP), 0.0), keep


def _run(spec, algo, batch, responses, mask, adv, old, ref, roll, shared, micro, mode):
    model = build_model(spec, seed=0)
    if micro is None:
        freeze_for_graph(model, spec)
        lp = _reference(model, spec, batch, responses, shared)
        weights, keep = _expected(old, roll, mask)
        loss, _ = policy_loss(lp, old, ref, adv, keep, CLIP, KL, is_weights=weights)
        loss.backward()
    else:
        trainer = TorchTrainer(model, spec, algo)
        trainer.micro_batches = micro
        trainer.micro_recompute, trainer.micro_fused = mode == "recomputed", mode == "fused"
        lp, _ = trainer_logprobs(trainer, batch, responses, shared)
        out = trainer.loss(lp, TokenLogprobs(old, mask), adv, TokenLogprobs(ref, mask), CLIP, KL,
                           rollout=TokenLogprobs(roll, mask))  # fmt: skip
        trainer.backward(out)
        loss = out.value
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


@pytest.mark.parametrize("shared", [True, False])
def test_corrected_micro_batches_equal_one_batch(spec, prompts, shared):  # noqa: F811
    algo = AlgoSpec(
        lr=1e-2,
        rollout_correction={
            "rollout_is": "token",
            "rollout_is_threshold": CAP,
            "rollout_rs": "geometric",
            "rollout_rs_threshold": UPPER,
        },
    )
    responses, mask, adv, gen = _rollout(spec, "grpo")
    old, ref = _old_and_ref(spec, prompts, responses, mask, gen)
    roll = torch.where(mask, old + 0.4 * torch.randn(old.shape, generator=gen), float("-inf"))
    weights, keep = _expected(old, roll, mask)
    # the data exercises both: some weights truncated, some responses rejected, not all
    assert (weights > CAP - 1e-6).any() and 0 < keep.sum() < mask.sum()
    args = (spec, algo, prompts, responses, mask, adv, old, ref, roll, shared)
    loss, grads = _run(*args, micro=None, mode="")
    assert grads and all(g.abs().sum() > 0 for g in grads.values())
    for micro, mode in ((1, "kept"), (2, "kept"), (3, "recomputed"), (2, "fused")):
        got_loss, got_grads = _run(*args, micro=micro, mode=mode)
        assert torch.allclose(got_loss, loss, rtol=1e-5, atol=0), (micro, got_loss, loss)
        assert got_grads.keys() == grads.keys()
        for name, g in grads.items():
            assert _close(got_grads[name], g), (micro, name)
