"""Training in micro-batches equals training in one batch: the loss, every gradient and the
parameters after one AdamW step, for the prefix-shared forward and verl's per-sample one,
for GRPO, RLOO and PPO-style per-token advantages, each loss aggregation, a frozen and a
trained vision tower; against one plain forward and backward with no micro-batches and
no checkpointing (what the trainer ran before)."""

from __future__ import annotations

import itertools

import pytest
import torch

from rollplex.backends.torch.critic import TorchCritic, build_critic_model
from rollplex.backends.torch.full_forward import features_full_head_outputs, features_full_logprobs
from rollplex.backends.torch.logprob import response_head_outputs, response_logprobs
from rollplex.backends.torch.loss import (
    group_advantages,
    leave_one_out_advantages,
    micro_batch_weights,
    policy_loss,
    value_loss,
)
from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.roles import features_of, freeze_for_graph
from rollplex.backends.torch.task import QUESTIONS, VisualTask
from rollplex.backends.torch.tokenizer import encode_prompt
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.backends.torch.values import Pixels, Responses, TokenLogprobs
from rollplex.data.prompts import collate_prompts
from rollplex.engine.prefix import expand_prefix, prefix_forward
from rollplex.ops.micro_batches import micro_ranges
from rollplex.specs import AlgoSpec

G, R, PROMPTS = 3, 6, 5
CLIP, KL = 0.2, 0.05


@pytest.fixture(scope="module")
def prompts(tokenizer, processor, spec):
    """Five prompts of unequal length (two image sizes, three questions)."""
    samples = VisualTask(seed=3).samples(0, PROMPTS)
    questions = list(QUESTIONS.values())
    encoded = [
        encode_prompt(
            tokenizer,
            processor,
            s.image.resize((56, 56)) if i % 2 else s.image,
            questions[i % len(questions)],
        )
        for i, s in enumerate(samples)
    ]
    return collate_prompts(encoded, pad_id=spec.special_tokens.pad_token_id)


def _rollout(spec, estimator: str, seed: int = 0):
    """Responses, old and reference logprobs near the policy's, and advantages."""
    gen = torch.Generator().manual_seed(seed)
    n = PROMPTS * G
    tokens = torch.randint(7, spec.vocab_size, (n, R), generator=gen)
    lengths = torch.randint(1, R + 1, (n,), generator=gen)
    lengths[0] = R
    mask = torch.arange(R)[None, :] < lengths[:, None]
    rewards = torch.randint(0, 2, (n,), generator=gen).float() + torch.rand(n, generator=gen)
    if estimator == "grpo":
        adv = group_advantages(rewards, G)
    elif estimator == "rloo":
        adv = leave_one_out_advantages(rewards, G)
    else:  # PPO: one advantage per token (GAE's shape)
        adv = torch.randn((n, R), generator=gen)
    return Responses(tokens, lengths), mask, adv, gen


def _reference(model, spec, batch, responses, shared: bool, head: bool = False):
    """One forward with grad over every sample, no micro-batches, no checkpointing:
    logprobs, or with `head` the head's outputs (a critic's values) [S, R]."""
    with torch.set_grad_enabled(spec.trainable_vision):
        feats = features_of(model, Pixels.of(batch))
    if shared:
        state = prefix_forward(model, batch.text_only(), feats.values, grad=True)
        state = expand_prefix(state, G)
        if head:
            first, rest = response_head_outputs(model, state, responses.tokens, responses.lengths)
            return torch.cat([first.float(), rest.squeeze(-1).float()], 1)
        return response_logprobs(model, state, responses.tokens, responses.lengths)
    args = (batch.text_only().repeat(G), feats.repeat(G).values, responses.tokens)
    if head:
        return features_full_head_outputs(model, *args, responses.lengths).squeeze(-1).float()
    return features_full_logprobs(model, *args, responses.lengths)


def _old_and_ref(spec, batch, responses, mask, gen):
    with torch.no_grad():
        lp = _reference(build_model(spec, seed=0), spec, batch, responses, shared=True)
    # Old logprobs off the policy so the clip binds on some tokens; a reference further off.
    old = lp + 0.3 * torch.randn(lp.shape, generator=gen)
    ref = lp + 0.5 * torch.randn(lp.shape, generator=gen)
    return torch.where(mask, old, 0.0), torch.where(mask, ref, 0.0)


def _adamw_step(params, algo):
    # eps well above gradient rounding: at the default 1e-8 Adam's first step is lr*sign(g),
    # which turns rounding noise on a near-zero gradient into a whole step either way.
    opt = torch.optim.AdamW(params, lr=algo.lr, betas=tuple(algo.adam_betas), eps=1e-3)
    torch.nn.utils.clip_grad_norm_(params, algo.max_grad_norm)
    opt.step()


def _train(
    spec, algo, batch, responses, mask, adv, old, ref, shared: bool, micro: int | None,
    recompute: bool = False,
):  # fmt: skip
    """(loss, {name: grad}, {name: param after one step}, metrics); micro=None: reference.
    `recompute`: each micro-batch's forward runs again inside the backward, and nothing
    is kept for the backward between the two steps."""
    model = build_model(spec, seed=0)
    if micro is None:
        freeze_for_graph(model, spec)
        lp = _reference(model, spec, batch, responses, shared)
        loss, metrics = policy_loss(
            lp, old, ref, adv, mask, CLIP, KL,
            loss_agg_mode=algo.loss_agg_mode, loss_mode=algo.loss_mode,
        )  # fmt: skip
        loss.backward()
        params = [p for p in model.parameters() if p.requires_grad]
    else:
        trainer = TorchTrainer(model, spec, algo)
        trainer.micro_batches, trainer.micro_recompute = micro, recompute
        lp, saved = trainer_logprobs(trainer, batch, responses, shared)
        kept = sum(t.numel() for t in saved.tensors())
        assert (kept == 0) == recompute  # recompute: the forward kept nothing
        out = trainer.loss(lp, TokenLogprobs(old, mask), adv, TokenLogprobs(ref, mask), CLIP, KL)
        trainer.backward(out)
        loss, metrics, params = out.value, out.metrics, list(trainer.params)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    _adamw_step(params, algo)
    after = {n: p.detach().clone() for n, p in model.named_parameters()}
    return loss.detach(), grads, after, metrics


def trainer_logprobs(trainer: TorchTrainer, batch, responses, shared: bool, group: int = G):
    """(logprobs, saved) of the trainer's training forward over `group` responses a
    prompt: the shared prefix's, or verl's per-sample one."""
    text, feats = batch.text_only(), trainer.vision_encode(Pixels.of(batch))
    if shared:
        state, _ = trainer.logprob_prefix(feats, text)
        return trainer.logprob_response(state, responses, group)
    return trainer.logprob(feats.repeat(group), text.repeat(group), responses)


def _close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-5) -> bool:
    return bool((a - b).norm() <= rel * b.norm() + 1e-12)


CASES = [
    # (shared prefix, advantage, loss aggregation, trainable vision, loss mode)
    (True, "grpo", "token-mean", False, "vanilla"),
    (False, "grpo", "token-mean", False, "vanilla"),
    (True, "rloo", "seq-mean-token-mean", False, "vanilla"),
    (False, "ppo", "seq-mean-token-sum", True, "vanilla"),
    (True, "ppo", "token-mean", True, "vanilla"),
    # GSPO's ratio is its row's: a micro-batch holds whole rows, so it splits the same way
    (True, "grpo", "seq-mean-token-mean", False, "gspo"),
    (False, "ppo", "seq-mean-token-mean", True, "gspo"),
    (False, "grpo", "token-mean", False, "cispo"),  # its weight is a constant per token
]


@pytest.mark.parametrize(("shared", "estimator", "agg", "vision", "mode"), CASES)
def test_micro_batches_equal_one_batch(spec, prompts, shared, estimator, agg, vision, mode):
    spec = spec.model_copy(update={"trainable_vision": vision})
    algo = AlgoSpec(lr=1e-2, loss_agg_mode=agg, loss_mode=mode)
    responses, mask, adv, gen = _rollout(spec, estimator)
    old, ref = _old_and_ref(spec, prompts, responses, mask, gen)
    args = (spec, algo, prompts, responses, mask, adv, old, ref, shared)
    loss, grads, after, _ = _train(*args, micro=None)
    start = build_model(spec, seed=0).state_dict()
    assert grads and all(g.abs().sum() > 0 for g in grads.values())
    # 2 and 3 split 5 prompts (15 samples) unevenly; 4 prompts' groups; more than the units
    runs = [(m, False) for m in (1, 2, 3, 4, 20)] + [(m, True) for m in (1, 3, 20)]
    for micro, recompute in runs:
        got_loss, got_grads, got_after, metrics = _train(*args, micro=micro, recompute=recompute)
        units = PROMPTS if shared else PROMPTS * G
        assert metrics["train_micro_batches"] == min(micro, units)
        assert torch.allclose(got_loss, loss, rtol=1e-5, atol=0), (micro, got_loss, loss)
        assert got_grads.keys() == grads.keys()
        for name, g in grads.items():
            assert _close(got_grads[name], g), (micro, name)
        for name, p in after.items():
            assert _close(got_after[name] - start[name], p - start[name]), (micro, name)


def test_micro_ranges_cover_the_rows_in_order():
    for units in (1, 5, 15):
        for count in (1, 2, 3, 4, 16):
            ranges = micro_ranges(units, count)
            assert len(ranges) == min(units, count)
            assert ranges[0][0] == 0 and ranges[-1][1] == units
            assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
            sizes = [hi - lo for lo, hi in ranges]
            assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    with pytest.raises(ValueError, match="micro-batch count must be >= 1"):
        micro_ranges(5, 0)


def test_micro_batch_weights_sum_the_whole_batch_loss():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((7, 5), generator=gen)
    mask = torch.rand((7, 5), generator=gen) > 0.4
    mask[3] = False  # a sequence with no valid token
    from rollplex.backends.torch.loss import aggregate

    rows = [(0, 2), (2, 3), (3, 4), (4, 7)]
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        weights = micro_batch_weights(mask, rows, mode)
        parts = [
            aggregate(x[lo:hi], mask[lo:hi], mode) * w
            for (lo, hi), w in zip(rows, weights, strict=False)
        ]
        assert torch.allclose(sum(parts), aggregate(x, mask, mode), rtol=1e-6)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        micro_batch_weights(mask, rows, "sum")


@pytest.mark.parametrize("shared", [True, False])
def test_critic_micro_batches_equal_one_batch(spec, prompts, shared):
    """PPO's critic trains in the same micro-batches: value loss and gradients match one
    plain forward and backward."""
    responses, mask, _, gen = _rollout(spec, "ppo")
    returns = torch.randn(mask.shape, generator=gen)
    old = TokenLogprobs(torch.where(mask, 0.1 * torch.randn(mask.shape, generator=gen), 0.0), mask)

    def critic():
        policy = build_model(spec, seed=0)
        return TorchCritic(build_critic_model(policy, spec, seed=0), spec, AlgoSpec(name="ppo"))

    plain = critic()
    head = _reference(plain.model, spec, prompts, responses, shared, head=True)
    loss, _ = value_loss(torch.where(mask, head, 0.0), returns, old.values, mask, 0.2)
    loss.backward()
    grads = {n: p.grad for n, p in plain.model.named_parameters() if p.grad is not None}
    for micro, recompute in ((2, False), (3, False), (3, True)):
        c = critic()
        c.micro_batches, c.micro_recompute = micro, recompute
        feats, text = features_of(c.model, Pixels.of(prompts)), prompts.text_only()
        if shared:
            state, _ = c.trainer.logprob_prefix(feats, text)
            values, _ = c.trainer.logprob_response(state, responses, G)
        else:
            values, _ = c.trainer.logprob(feats.repeat(G), text.repeat(G), responses)
        out = c.loss(values, returns, old, clip=0.2)
        c.backward(out)
        assert len(values.micro.rows) == micro
        assert torch.allclose(out.value, loss, rtol=1e-5, atol=0)
        got = {n: p.grad for n, p in c.model.named_parameters() if p.grad is not None}
        assert got.keys() == grads.keys()
        assert all(_close(got[n], g) for n, g in grads.items())


def test_micro_batches_run_only_the_columns_their_rows_use(spec, prompts):
    """A micro-batch without the step's longest response runs (and keeps for backward)
    only the columns up to its own longest: same logprobs as the full width, zeros after."""
    from rollplex.backends.torch.activations import SavedActivations
    from rollplex.backends.torch.checkpointing import checkpointed_layers
    from rollplex.backends.torch.micro import response_micro_batches
    from rollplex.backends.torch.roles import capture_saved

    model = build_model(spec, seed=0)
    freeze_for_graph(model, spec)
    lengths = torch.tensor([2, 1, 2, 4, 3, 4, 6, 5, 1, 1, 1, 1, 3, 6, 2])  # per group: 2 4 6 1 6
    tokens = torch.randint(7, spec.vocab_size, (PROMPTS * G, R), generator=torch.Generator())
    responses = Responses(tokens, lengths)
    feats = features_of(model, Pixels.of(prompts))
    saved = SavedActivations()
    with capture_saved(saved), checkpointed_layers(model, saved):
        prefix = prefix_forward(model, prompts.text_only(), feats.values, grad=True)
    widths = []

    def score(state, t, lens, _rows):
        widths.append(t.shape[1])
        return response_logprobs(model, state, t, lens)

    out, _ = response_micro_batches(model, prefix, responses, G, PROMPTS, score)
    assert widths == [2, 4, 6, 1, 6]
    with torch.no_grad():
        full = response_logprobs(model, expand_prefix(prefix, G), tokens, lengths)
    torch.testing.assert_close(out.values, full * out.mask, atol=1e-5, rtol=0)
    assert out.values.shape == (PROMPTS * G, R) and not out.values[~out.mask].any()
