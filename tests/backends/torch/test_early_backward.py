"""Early backward (backends/torch/early_backward.py): rows backpropagated one by one as they
end, in any order, into their group's two accumulators, combined when the group's last
reward is in and scaled once by the batch's units, give the batch gradient of the policy
loss (loss.py) on the tiny Qwen2.5-VL: to 1e-6 in float32 and 1e-7 in float64, for
token-mean and both seq-mean aggregations, with and without std normalisation, GRPO and
RLOO, with and without the k3 KL term. (float64 is bounded near 1e-8 by transformers'
RMSNorm, which computes in float32 whatever the model's dtype: 1e-7 is asserted.)
Settings that are not linear in a row's advantage are refused by name; a row outside the
clip band waits for its group and stays exact."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.early_backward import (
    GroupAccumulator,
    batch_units,
    inside_clip_band,
    refusal,
    row_terms,
)
from rollplex.backends.torch.full_forward import full_hidden, full_logprobs
from rollplex.backends.torch.logprob import response_mask
from rollplex.backends.torch.loss import (
    AGG_MODES,
    group_advantages,
    leave_one_out_advantages,
    policy_loss,
)
from rollplex.backends.torch.model import build_model
from rollplex.specs import AlgoSpec

G = 3  # responses per prompt; the conftest batch has 2 prompts
LENGTHS = torch.tensor([3, 1, 4, 2, 4, 3])


@pytest.fixture(scope="module", params=[torch.float32, torch.float64], ids=["fp32", "fp64"])
def setting(request, spec, batch):
    dtype = request.param
    model = build_model(spec, seed=0, dtype=dtype)
    for p in model.model.visual.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(11)
    n = batch.size * G
    tokens = torch.randint(7, spec.vocab_size, (n, int(LENGTHS.max())), generator=gen)
    tokens = torch.where(response_mask(LENGTHS, tokens.shape[1]), tokens, 0)
    with torch.no_grad():
        now = _logprobs(model, batch, tokens, LENGTHS, G).to(dtype)
    # the rollout's logprobs: off the trainer's by rounding-size amounts (inside the band)
    old = now + 0.05 * (torch.rand(now.shape, generator=gen, dtype=dtype) - 0.5)
    ref = now + 0.6 * (torch.rand(now.shape, generator=gen, dtype=dtype) - 0.5)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.25, 0.25, 0.25])  # group 2: sigma = 0
    params = [p for p in model.parameters() if p.requires_grad]
    return model, batch, tokens, old, ref, rewards, params, dtype


def _logprobs(model, batch, tokens, lengths, group_size):
    """The trainer's logprobs (logprob.py, whose head works in float32); for a float64
    model, the same forward with the log-softmax in float64."""
    if model.dtype == torch.float32:
        return full_logprobs(model, batch, tokens, lengths, group_size)
    logits = model.lm_head(full_hidden(model, batch, tokens, lengths, group_size))
    out = logits.log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return torch.where(response_mask(lengths, tokens.shape[1]), out, 0.0)


def _advantages(rewards, algo: AlgoSpec, dtype: torch.dtype) -> torch.Tensor:
    """loss.py's advantages; in float64 the same formulas in float64 (loss.py rounds them
    to float32, which would bound a float64 comparison at float32's precision)."""
    if dtype == torch.float32:
        if algo.name == "rloo":
            return leave_one_out_advantages(rewards, G)
        return group_advantages(rewards, G, norm_by_std=algo.norm_adv_by_std_in_grpo)
    r = rewards.double().view(-1, G)
    centred = r - r.mean(1, keepdim=True)
    if algo.name == "rloo":
        return (centred * G / (G - 1)).view(-1)
    if algo.norm_adv_by_std_in_grpo:
        centred = centred / (r.std(1, keepdim=True) + 1e-6)
    return centred.view(-1)


def _batch_gradient(setting, algo: AlgoSpec, old=None):
    model, batch, tokens, old0, ref, rewards, params, dtype = setting
    old = old0 if old is None else old
    lp = _logprobs(model, batch, tokens, LENGTHS, G)
    mask = response_mask(LENGTHS, tokens.shape[1])
    adv = _advantages(rewards, algo, dtype).to(dtype)
    loss, _ = policy_loss(
        lp, old, ref, adv, mask, algo.clip_eps, algo.kl_coef,
        clip_ratio_c=algo.clip_ratio_c, loss_agg_mode=algo.loss_agg_mode,
    )  # fmt: skip
    return torch.autograd.grad(loss, params)


def _early_gradient(setting, algo: AlgoSpec, order: list[int], old=None):
    """Rows in `order` (as they end): each row's forward and backward alone."""
    model, batch, tokens, old0, ref, rewards, params, dtype = setting
    old = old0 if old is None else old
    mask = response_mask(LENGTHS, tokens.shape[1])
    groups = [GroupAccumulator(params, G) for _ in range(batch.size)]
    total = [torch.zeros_like(p) for p in params]
    late = 0
    for i in order:
        g = i // G
        lp = _logprobs(model, batch.select(g, g + 1), tokens[i : i + 1], LENGTHS[i : i + 1], 1)
        pg, kl = row_terms(lp, old[i : i + 1], ref[i : i + 1], mask[i : i + 1], algo, algo.kl_coef)
        if kl is not None:  # no advantage in it: straight into the batch sum
            for t, x in zip(total, torch.autograd.grad(kl, params, retain_graph=True), strict=True):
                t.add_(x)
        band = inside_clip_band(lp, old[i : i + 1], mask[i : i + 1], algo.clip_eps, 3.0)
        if band:
            groups[g].add(i, float(rewards[i]), pg)
        else:
            groups[g].add_late(i, float(rewards[i]), pg)
            late += 1
        if groups[g].complete:
            part = groups[g].combine(algo.name, algo.norm_adv_by_std_in_grpo)
            for t, x in zip(total, part, strict=True):
                t.add_(x)
    units = batch_units(mask, algo).to(dtype)
    return [t / units for t in total], late


ORDERS = [[0, 1, 2, 3, 4, 5], [4, 1, 5, 0, 3, 2]]


def _tol(setting) -> float:
    return 1e-6 if setting[-1] == torch.float32 else 1e-7


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("kl_coef", [0.0, 0.04])
@pytest.mark.parametrize(
    ("name", "norm"), [("grpo", True), ("grpo", False), ("rloo", True)],
    ids=["grpo_std", "grpo_no_std", "rloo"],
)  # fmt: skip
def test_early_backward_equals_the_batch_gradient(setting, mode, norm, kl_coef, name):
    algo = AlgoSpec(name=name, loss_agg_mode=mode, norm_adv_by_std_in_grpo=norm, kl_coef=kl_coef)
    assert refusal(algo) is None
    want = _batch_gradient(setting, algo)
    tol = _tol(setting)
    for order in ORDERS:
        got, late = _early_gradient(setting, algo, order)
        assert late == 0
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, atol=tol, rtol=0)
    assert max(float(w.abs().max()) for w in want) > 100 * tol  # the test can fail


def test_a_row_outside_the_band_waits_for_its_group_and_stays_exact(setting):
    """A token whose rollout logprob is far from the trainer's: the clip binds, the row's
    gradient depends on the sign of its advantage, so it runs once the group has ended."""
    old = setting[3].clone()
    old[1, 0] -= 0.5  # ratio e^0.5 > 1.2 on row 1's first token
    algo = AlgoSpec(kl_coef=0.04)
    want = _batch_gradient(setting, algo, old)
    got, late = _early_gradient(setting, algo, ORDERS[1], old)
    assert late == 1
    tol = _tol(setting)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=tol, rtol=0)


def test_the_band_check_names_the_sign_dependence():
    lp = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert inside_clip_band(lp, lp + 0.1, mask, 0.2, 3.0)
    assert not inside_clip_band(lp, lp - 0.25, mask, 0.2, 3.0)  # r = 1.28 > 1.2
    far = lp.clone()
    far[0, 2] = 5.0  # a padding token: not read
    assert inside_clip_band(far, lp, mask, 0.2, 3.0)


@pytest.mark.parametrize(
    ("algo", "named"),
    [
        (AlgoSpec(name="ppo"), "algo.name=ppo"),
        (AlgoSpec(name="ppo", kl_in_reward=True), "algo.name=ppo"),
    ],
)
def test_settings_that_are_not_linear_are_refused_by_name(algo, named):
    assert named in (refusal(algo) or "")


def test_kl_in_reward_is_refused_by_name():
    algo = AlgoSpec(name="grpo").model_copy(update={"kl_in_reward": True})
    assert "algo.kl_in_reward" in (refusal(algo) or "")


def test_an_incomplete_group_cannot_combine(setting):
    acc = GroupAccumulator(setting[6], G)
    with pytest.raises(ValueError, match="0 of 3 rows ended"):
        acc.combine("grpo", True)
