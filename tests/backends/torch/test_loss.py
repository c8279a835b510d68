"""GRPO loss and group advantages: the terms vanish where they must, and the gradient
pushes logprobs the right way."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.loss import group_advantages, grpo_loss

MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])


def _logprobs(seed: int) -> torch.Tensor:
    return -torch.rand(MASK.shape, generator=torch.Generator().manual_seed(seed)) * 3


def test_zero_advantage_and_equal_logprobs_give_zero_pg():
    lp = _logprobs(0).requires_grad_()
    loss, m = grpo_loss(lp, lp.detach(), lp.detach(), torch.zeros(2), MASK, 0.2, kl_coef=0.1)
    assert m["pg_loss"] == 0 and m["kl"] == 0 and loss.item() == 0
    loss.backward()
    assert (lp.grad == 0).all()  # k3's gradient also vanishes at policy == ref


def test_kl_zero_only_when_policy_equals_ref():
    lp, ref = _logprobs(0), _logprobs(1)
    _, same = grpo_loss(lp, lp, lp, torch.ones(2), MASK, 0.2, kl_coef=1.0)
    _, diff = grpo_loss(lp, lp, ref, torch.ones(2), MASK, 0.2, kl_coef=1.0)
    assert same["kl"] == 0 and diff["kl"] > 0


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_gradient_sign_follows_advantage(sign):
    lp = _logprobs(0).requires_grad_()
    loss, _ = grpo_loss(lp, lp.detach(), lp.detach(), torch.tensor([sign, sign]), MASK, 0.2, 0.0)
    loss.backward()
    valid = MASK.bool()
    # Gradient descent raises logprobs of positive-advantage tokens, lowers negative ones.
    assert (torch.sign(lp.grad[valid]) == -sign).all()
    assert (lp.grad[~valid] == 0).all()
    # Token mean: each valid token weighs 1 / (valid tokens).
    torch.testing.assert_close(lp.grad[valid], torch.full((5,), -sign / 5))


def test_clipped_ratio_has_no_gradient():
    old = _logprobs(0)
    lp = (old + 0.5).requires_grad_()  # ratio e^0.5 > 1 + eps
    loss, m = grpo_loss(lp, old, lp.detach(), torch.ones(2), MASK, 0.2, 0.0)
    loss.backward()
    assert m["clip_frac"] == 1 and (lp.grad == 0).all()


def test_padding_values_do_not_leak():
    lp = _logprobs(0)
    junk = lp.masked_fill(~MASK.bool(), float("-inf"))
    a, _ = grpo_loss(lp, lp, lp, torch.ones(2), MASK, 0.2, 0.1)
    b, _ = grpo_loss(junk, lp, lp, torch.ones(2), MASK, 0.2, 0.1)
    assert torch.isfinite(b) and a == b


def test_group_advantages():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.5, 1.0])
    adv = group_advantages(rewards, 3).view(3, 3)
    torch.testing.assert_close(adv.mean(1), torch.zeros(3))
    assert (adv[1] == 0).all()  # all equal: no signal
    torch.testing.assert_close(adv[2].std(), torch.tensor(1.0), atol=1e-4, rtol=0)
    assert adv[0, 0] > 0 > adv[0, 1]
    # a group of one: verl's raw score, r / (1 + 1e-6) (tests/algos/test_verl_parity.py)
    torch.testing.assert_close(group_advantages(rewards, 1), rewards / (1 + 1e-6))
    with pytest.raises(ValueError):
        group_advantages(rewards, 2)


def test_leave_one_out_baseline_excludes_the_sample() -> None:
    from rollplex.backends.torch.loss import leave_one_out_advantages

    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    adv = leave_one_out_advantages(r, 3)
    assert torch.allclose(adv, torch.tensor([1.0, -0.5, -0.5, 0.0, 0.0, 0.0]))
    assert torch.allclose(adv.view(2, 3).sum(1), torch.zeros(2))  # zero-mean per group
