"""algo.skip_zero_advantage in the torch trainer: rows whose advantage is 0 (whole prompts'
groups on the shared prefix, single samples in verl's per-sample forward) run no forward and
no backward, and the step trains what training every row trains. Checked against the same
trainer given no advantages (every row trains, kept mode, one micro-batch) on a grid of
forwards x loss aggregations x trainable vision x which rows are dead x micro-batch modes:
the loss value, every gradient, and the parameters after two AdamW steps (weight decay on,
so that a step whose every row is dead must still step AdamW on zero gradients)."""

from __future__ import annotations

import itertools

import pytest
import torch

from rollplex.backends.torch import trainer as trainer_module
from rollplex.backends.torch.handles import GradsHandle
from rollplex.backends.torch.loss import policy_loss
from rollplex.backends.torch.model import build_model
from rollplex.backends.torch.row_ranges import live_units, skipping_ranges
from rollplex.backends.torch.trainer import TorchTrainer
from rollplex.backends.torch.values import Pixels, TokenLogprobs
from rollplex.specs import AlgoSpec
from tests.backends.torch.test_micro_batches import PROMPTS, G, _close, _old_and_ref, _rollout
from tests.backends.torch.test_micro_batches import prompts as prompts  # the fixture

CLIP = 0.2
# which prompts' groups (0..4) have all-zero advantages; "row" also zeroes one row of a
# live group (only the per-sample forward can skip a single row)
DEAD = {
    "none": (),
    "some": (1, 3),
    "ends": (0, 4),
    "all_but_one": (0, 1, 3, 4),
    "all": (0, 1, 2, 3, 4),
}
# (micro-batches, recompute, fused)
MODES = [(1, False, False), (2, False, False), (3, True, False), (2, False, True)]
CASES = [
    # (shared prefix, loss aggregation (or gspo, with its own), trainable vision, the
    # prefix's own forward skips too)
    (True, "token-mean", False, False),
    (False, "seq-mean-token-mean", False, False),
    (True, "seq-mean-token-sum", True, False),
    (True, "seq-mean-token-sum-norm", False, False),
    (False, "token-mean", True, False),
    # graph/passes/skip_dead_prefix.py: the dead prompts' vision encode and prefix forward
    # are not run either
    (True, "token-mean", False, True),
    (True, "seq-mean-token-sum", True, True),
    # GSPO: a dead row's sequence ratio multiplies an advantage of 0 as well
    (True, "gspo", True, True),
]


def _advantages(adv: torch.Tensor, dead: tuple[int, ...], row: bool) -> torch.Tensor:
    adv = adv.clone()
    for p in dead:
        adv[p * G : (p + 1) * G] = 0.0
    if row:
        adv[2 * G + 1] = 0.0  # one row of a live group
    return adv


def _trainer(spec, algo, micro: int, recompute: bool, fused: bool) -> TorchTrainer:
    t = TorchTrainer(build_model(spec, seed=0), spec, algo)
    t.micro_batches, t.micro_recompute, t.micro_fused = micro, recompute, fused
    for group in t.optimizer.param_groups:  # (test_micro_batches._adamw_step says why)
        group["eps"] = 1e-3
    return t


def _step(
    t: TorchTrainer, batch, responses, adv, old, mask, shared: bool, skip: bool, prefix=False
):
    """One RL step's training: (loss value, metrics, {name: grad}); `prefix`: the vision
    encode and the prefix forward are given the advantages too."""
    live = adv if skip else None
    feats = t.vision_encode(Pixels.of(batch), advantages=live if prefix else None)
    text = batch.text_only()
    if shared:
        state, _ = t.logprob_prefix(feats, text, advantages=live if prefix else None)
        lp, _ = t.logprob_response(state, responses, G, advantages=live)
    else:
        lp, _ = t.logprob(feats.repeat(G), text.repeat(G), responses, advantages=live)
    out = t.loss(lp, TokenLogprobs(old, mask), adv, None, CLIP, 0.0)
    t.backward(out)
    grads = {n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None}
    t.optimizer_step(GradsHandle(t.params))
    return out.value.detach(), out.metrics, grads


@pytest.mark.parametrize(("shared", "agg", "vision", "prefix"), CASES)
def test_skipping_zero_advantage_rows_trains_what_every_row_trains(
    spec, prompts, shared, agg, vision, prefix
):
    spec = spec.model_copy(update={"trainable_vision": vision})
    mode = {"loss_mode": "gspo"} if agg == "gspo" else {"loss_agg_mode": agg}
    algo = AlgoSpec(lr=1e-2, kl_coef=0, weight_decay=0.1, **mode)
    responses, mask, adv0, gen = _rollout(spec, "grpo")
    old, _ = _old_and_ref(spec, prompts, responses, mask, gen)
    first = _advantages(adv0, DEAD["some"], row=False)  # step 1 gives AdamW moments
    for pattern, dead in DEAD.items():
        adv = _advantages(adv0, dead, row=not shared and pattern == "some")
        steps = [first, adv]
        base = _trainer(spec, algo, 1, False, False)
        want = [_step(base, prompts, responses, a, old, mask, shared, False) for a in steps]
        for micro, recompute, fused in MODES:
            t = _trainer(spec, algo, micro, recompute, fused)
            got = [_step(t, prompts, responses, a, old, mask, shared, True, prefix) for a in steps]
            at = (pattern, micro, recompute, fused)
            for (loss, _, grads), (w_loss, _, w_grads) in zip(got, want, strict=True):
                torch.testing.assert_close(loss, w_loss, rtol=1e-5, atol=1e-7, msg=str(at))
                assert grads.keys() == w_grads.keys(), at
                for n, g in w_grads.items():
                    assert _close(grads[n], g), (at, n)
            trained = int((adv != 0).sum()) if not shared else G * (PROMPTS - len(dead))
            assert got[1][1]["trained_rows"] == trained, at
            for n, p in base.model.named_parameters():
                assert _close(dict(t.model.named_parameters())[n].detach(), p.detach()), (at, n)


def test_dead_rows_are_never_scored_and_the_metrics_are_the_trained_rows(
    spec, prompts, monkeypatch
):
    """The work goes: the forwards score only live groups' rows (kept mode once, recompute
    twice, fused once in the backward); the loss's ratio metrics are the trained rows'."""
    algo = AlgoSpec(lr=1e-2, kl_coef=0)
    responses, mask, adv0, gen = _rollout(spec, "grpo")
    old, _ = _old_and_ref(spec, prompts, responses, mask, gen)
    adv = _advantages(adv0, DEAD["some"], row=False)
    scored: list[int] = []
    real = trainer_module.response_logprobs

    def counting(model, state, tokens, *a, **k):
        scored.append(tokens.shape[0])
        return real(model, state, tokens, *a, **k)

    monkeypatch.setattr(trainer_module, "response_logprobs", counting)
    live_rows = G * (PROMPTS - len(DEAD["some"]))
    for (micro, recompute, fused), passes in zip(MODES, (1, 1, 2, 1), strict=True):
        scored.clear()
        t = _trainer(spec, algo, micro, recompute, fused)
        _, metrics, _ = _step(t, prompts, responses, adv, old, mask, True, True)
        assert sum(scored) == passes * live_rows, (micro, recompute, fused, scored)
        assert metrics["trained_rows"] == live_rows
    scored.clear()
    t = _trainer(spec, algo, 1, False, False)
    feats = t.vision_encode(Pixels.of(prompts))
    state, _ = t.logprob_prefix(feats, prompts.text_only())
    lp, _ = t.logprob_response(state, responses, G)  # every row: the metrics' reference
    assert sum(scored) == G * PROMPTS
    rows = (adv != 0).nonzero().squeeze(1)
    _, want = policy_loss(
        lp.values[rows], old[rows], lp.values[rows], adv[rows], mask[rows], CLIP, 0.0
    )
    for k in ("ratio_mean", "ppo_kl", "clip_frac"):
        torch.testing.assert_close(metrics[k], want[k], rtol=1e-5, atol=1e-7, msg=k)


def test_a_step_with_no_live_row_logs_nan_for_the_trained_rows_metrics(spec, prompts):
    algo = AlgoSpec(lr=1e-2, kl_coef=0)
    responses, mask, adv0, gen = _rollout(spec, "grpo")
    old, _ = _old_and_ref(spec, prompts, responses, mask, gen)
    t = _trainer(spec, algo, 2, False, False)
    loss, metrics, grads = _step(t, prompts, responses, adv0 * 0, old, mask, True, True)
    assert loss == 0 and metrics["trained_rows"] == 0 and metrics["train_micro_batches"] == 0
    assert torch.isnan(metrics["ratio_mean"]) and torch.isnan(metrics["entropy"])
    assert grads and all(g.abs().sum() == 0 for g in grads.values())


@pytest.mark.parametrize("count", [1, 2, 3, 8])
def test_skipping_ranges_cover_every_unit_and_train_each_live_one_once(count):
    """On every dead/live pattern of 7 units: the ranges tile [0, 7) in order, a range
    trains exactly when its units are live, no trained range exceeds what the plan's count
    gives a batch of the live units, and at most count + gaps ranges train."""
    units = 7
    for bits in range(2**units):
        live = [bool(bits >> u & 1) for u in range(units)]
        ranges = skipping_ranges(units, count, live)
        assert ranges[0][0] == 0 and ranges[-1][1] == units
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        for lo, hi, trains in ranges:
            assert all(live[u] == trains for u in range(lo, hi)), (live, ranges)
        n_live = sum(live)
        biggest = -(-n_live // min(count, n_live)) if n_live else 0
        assert all(hi - lo <= biggest for lo, hi, t in ranges if t)
        gaps = sum(1 for a, b in itertools.pairwise(live) if a and not b)
        assert sum(t for *_, t in ranges) <= min(count, max(n_live, 1)) + gaps


def test_live_units_read_exact_zeros_only():
    adv = torch.tensor([0.0, 0.0, 0.0, 1e-30, 0.0, 0.0, -0.0, 0.0, 0.0])
    assert live_units(adv, 3, 3) == [False, True, False]
    assert live_units(adv, 9, 1) == [a != 0 for a in adv.tolist()]
    assert live_units(None, 4, 2) == [True] * 4
    with pytest.raises(ValueError, match="advantages"):
        live_units(adv, 2, 2)


@pytest.mark.parametrize("shared", [True, False])
def test_the_old_logprob_scorer_skips_dead_rows_and_scores_the_rest_as_before(
    spec, prompts, shared, monkeypatch
):
    """PPO-style updates' old-logprob forward (the trained model scored without grad):
    given the advantages, it scores only live rows, each as scoring every row does; dead
    rows hold 0 (no update trains them, so nothing reads them)."""
    from rollplex.backends.torch import roles

    responses, _, adv0, _ = _rollout(spec, "grpo")
    adv = _advantages(adv0, DEAD["some"], row=not shared)
    prompt_rows = torch.tensor(live_units(adv, PROMPTS, G)).repeat_interleave(G)
    rows = prompt_rows if shared else adv != 0  # shared: a prompt's G rows go together
    t = _trainer(spec, AlgoSpec(kl_coef=0), 1, False, False)
    scorer = t.scorer()
    feats, text = scorer.vision_encode(Pixels.of(prompts)), prompts.text_only()
    scored: list[int] = []
    real = roles.response_logprobs if shared else roles.features_full_logprobs

    def counting(model, a, b, tokens, *rest, **kw):
        scored.append(tokens.shape[0])
        return real(model, a, b, tokens, *rest, **kw)

    name = "response_logprobs" if shared else "features_full_logprobs"
    monkeypatch.setattr(roles, name, counting)
    out = {}
    for live in (None, adv):
        scored.clear()
        if shared:
            state = scorer.logprob_prefix(feats, text)
            out[live is None] = scorer.logprob_response(state, responses, G, advantages=live)
        else:
            args = (feats.repeat(G), text.repeat(G), responses)
            out[live is None] = scorer.logprob(*args, advantages=live)
        assert sum(scored) == (G * PROMPTS if live is None else int(rows.sum())), scored
    full, skipped = out[True], out[False]
    rows = (
        adv != 0 if not shared else torch.tensor(live_units(adv, PROMPTS, G)).repeat_interleave(G)
    )
    assert torch.equal(skipped.mask, full.mask)
    torch.testing.assert_close(skipped.values[rows], full.values[rows], rtol=1e-5, atol=1e-6)
    assert not skipped.values[~rows].any()


def test_only_a_whole_batch_under_the_plans_count_is_warned_of(caplog):
    """More planned micro-batches than units says the plan was made for another batch; more
    than the live units is only the skip."""
    with caplog.at_level("WARNING", logger="rollplex.backends.torch.row_ranges"):
        skipping_ranges(5, 4, [True, False, False, True, False], "prompts (skip check)")
        assert not caplog.records
        skipping_ranges(3, 4, [True] * 3, "prompts (skip check)")
        assert ["exceed this step's 3" in r.getMessage() for r in caplog.records] == [True]
