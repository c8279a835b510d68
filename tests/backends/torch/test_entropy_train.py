"""The policy's entropy from the training forward: the `entropy` metric equals
token_entropy on a separate full forward's logits, and with entropy_coeff > 0 the
gradient is autograd's of (policy loss - coeff * aggregated entropy) written out by hand;
for the prefix-shared and the per-sample forward, kept, recomputed and fused
micro-batches, at a temperature that is not 1."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.full_forward import features_full_head_outputs
from rollplex.backends.torch.logprob import response_logprobs, token_entropy, token_logprobs
from rollplex.backends.torch.loss import group_advantages, policy_loss
from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.roles import features_of, freeze_for_graph
from rollplex.backends.torch.task import QUESTIONS, VisualTask
from rollplex.backends.torch.tokenizer import encode_prompt
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.backends.torch.values import Pixels, Responses, TokenLogprobs
from rollplex.data.prompts import collate_prompts
from rollplex.engine.prefix import prefix_forward
from rollplex.specs import AlgoSpec
from tests.backends.torch.test_micro_batches import trainer_logprobs

G, R, PROMPTS, T = 2, 5, 3, 0.7
CLIP, KL = 0.2, 0.05
MODES = ["kept", "recomputed", "fused"]


@pytest.fixture(scope="module")
def prompts(tokenizer, processor, spec):
    samples = VisualTask(seed=5).samples(0, PROMPTS)
    questions = list(QUESTIONS.values())
    encoded = [
        encode_prompt(tokenizer, processor, s.image, questions[i % len(questions)])
        for i, s in enumerate(samples)
    ]
    return collate_prompts(encoded, pad_id=spec.special_tokens.pad_token_id)


@pytest.fixture(scope="module")
def rollout(spec):
    gen = torch.Generator().manual_seed(1)
    n = PROMPTS * G
    tokens = torch.randint(7, spec.vocab_size, (n, R), generator=gen)
    lengths = torch.randint(1, R + 1, (n,), generator=gen)
    lengths[0] = R
    mask = torch.arange(R)[None, :] < lengths[:, None]
    adv = group_advantages(torch.rand(n, generator=gen), G)
    noise = (0.3 * torch.randn(n, R, generator=gen), 0.5 * torch.randn(n, R, generator=gen))
    return Responses(tokens, lengths), mask, adv, noise


def _full(model, spec, batch, responses, mask):
    """Logprobs and entropies [N, R] from one plain per-sample forward's logits [N, R, V]."""
    with torch.set_grad_enabled(spec.trainable_vision):
        feats = features_of(model, Pixels.of(batch))
    logits = features_full_head_outputs(
        model, batch.text_only().repeat(G), feats.repeat(G).values, responses.tokens,
        responses.lengths,
    )  # fmt: skip
    lp = token_logprobs(logits, responses.tokens, T)
    ent = token_entropy(logits, T)
    return torch.where(mask, lp, 0.0), torch.where(mask, ent, 0.0)


def _old_ref(model, spec, batch, responses, mask, noise):
    with torch.no_grad():
        lp, _ = _full(model, spec, batch, responses, mask)
    return torch.where(mask, lp + noise[0], 0.0), torch.where(mask, lp + noise[1], 0.0)


def _trained(spec, algo, batch, responses, mask, adv, old, ref, shared: bool, mode: str):
    """(metrics, {name: grad}) of the trainer's micro-batched step in `mode`."""
    trainer = TorchTrainer(build_model(spec, seed=0), spec, algo)
    trainer.micro_batches = 2
    trainer.micro_recompute = mode == "recomputed"
    trainer.micro_fused = mode == "fused"
    lp, _ = trainer_logprobs(trainer, batch, responses, shared, G)
    out = trainer.loss(lp, TokenLogprobs(old, mask), adv, TokenLogprobs(ref, mask), CLIP, KL)
    trainer.backward(out)  # fused mode fills the metrics in here
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return out.metrics, grads


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shared", [True, False], ids=["prefix-shared", "per-sample"])
def test_entropy_metric_is_the_full_forwards(spec, prompts, rollout, shared, mode):
    responses, mask, adv, noise = rollout
    model = build_model(spec, seed=0)
    old, ref = _old_ref(model, spec, prompts, responses, mask, noise)
    with torch.no_grad():
        _, ent = _full(model, spec, prompts, responses, mask)
    want = ent.sum() / mask.sum()  # token-mean, by hand
    algo = AlgoSpec(temperature=T)
    metrics, _ = _trained(spec, algo, prompts, responses, mask, adv, old, ref, shared, mode)
    assert want > 0.1  # a spread distribution: a zero entropy would pass nothing
    torch.testing.assert_close(metrics["entropy"], want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shared", [True, False], ids=["prefix-shared", "per-sample"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_entropy_coeff_gradient_is_autograds(spec, prompts, rollout, shared, mode, agg):
    responses, mask, adv, noise = rollout
    coeff = 0.3  # large, so the term moves the gradient well beyond rounding
    model = build_model(spec, seed=0)
    old, ref = _old_ref(model, spec, prompts, responses, mask, noise)
    freeze_for_graph(model, spec)
    lp, ent = _full(model, spec, prompts, responses, mask)
    pg, _ = policy_loss(lp, old, ref, adv, mask, CLIP, KL, loss_agg_mode=agg)
    token_mean = ent.sum() / mask.sum()
    seq_mean = (ent.sum(1) / mask.sum(1)).mean()  # each sequence's token mean, averaged
    agg_ent = token_mean if agg == "token-mean" else seq_mean
    (pg - coeff * agg_ent).backward()
    want = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    without = _trained(
        spec, AlgoSpec(temperature=T, loss_agg_mode=agg), prompts, responses, mask, adv, old,
        ref, shared, mode,
    )[1]  # fmt: skip
    algo = AlgoSpec(temperature=T, loss_agg_mode=agg, entropy_coeff=coeff)
    metrics, got = _trained(spec, algo, prompts, responses, mask, adv, old, ref, shared, mode)
    assert got.keys() == want.keys()
    for n, g in want.items():
        torch.testing.assert_close(got[n], g, rtol=1e-6, atol=1e-6, msg=n)
    moved = sum((got[n] - without[n]).norm() for n in want)
    assert moved > 1e-3 * sum(g.norm() for g in want.values())  # the term is really there
    torch.testing.assert_close(metrics["entropy"], agg_ent.detach(), rtol=1e-6, atol=1e-6)


def test_entropy_without_coeff_carries_no_grad(spec, prompts, rollout):
    """At entropy_coeff 0 the entropy is a metric: computed with no graph behind it."""
    responses, *_ = rollout
    model = build_model(spec, seed=0)
    with torch.no_grad():
        feats = features_of(model, Pixels.of(prompts))
    state = prefix_forward(model, prompts.text_only(), feats.values, grad=True)
    lp, ent = response_logprobs(
        model, state, responses.tokens, responses.lengths, T, G, entropy="metric"
    )
    assert lp.requires_grad and not ent.requires_grad
    lp, ent = response_logprobs(
        model, state, responses.tokens, responses.lengths, T, G, entropy="grad"
    )
    assert lp.requires_grad and ent.requires_grad
