"""The engine's sampling and roofline arithmetic, on their own."""

from __future__ import annotations

import pytest
import torch

from rollplex.backends.torch.logprob import token_logprobs
from rollplex.engine import sampling
from rollplex.engine.roofline import (
    kv_bytes_per_token,
    kv_token_reads,
    lm_weight_bytes,
    roofline,
)
from rollplex.engine.sampling import counter_uniform, draw, row_seeds, sample_rows


def test_counter_uniform_is_a_function_of_seed_and_step():
    seeds = row_seeds(torch.Generator().manual_seed(0), 4096, torch.device("cpu"))
    u0, u0_again, u1 = (counter_uniform(seeds, s) for s in (0, 0, 1))
    assert torch.equal(u0, u0_again) and not torch.equal(u0, u1)
    assert (u0 >= 0).all() and (u0 < 1).all()
    # A row's uniform does not depend on the other rows; a step given as a tensor is the int.
    assert torch.equal(counter_uniform(seeds[7:9], 0), u0[7:9])
    assert torch.equal(counter_uniform(seeds, torch.tensor([1])), u1)
    # Roughly uniform, and uncorrelated across steps.
    assert abs(float(u0.mean()) - 0.5) < 0.02 and abs(float(u0.var()) - 1 / 12) < 0.005
    assert abs(float(torch.corrcoef(torch.stack([u0, u1]))[0, 1])) < 0.05


def test_row_seeds_from_one_or_per_row_generators():
    dev = torch.device("cpu")
    a = row_seeds(torch.Generator().manual_seed(5), 3, dev)
    assert torch.equal(a, row_seeds(torch.Generator().manual_seed(5), 3, dev))
    per_row = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
    b = row_seeds(per_row, 3, dev)
    assert torch.equal(b[1:], row_seeds([torch.Generator().manual_seed(s) for s in (2, 3)], 2, dev))
    with pytest.raises(ValueError, match="row generators"):
        row_seeds(per_row, 4, dev)


def test_sample_rows_distribution_top_p_and_greedy():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]]).repeat(20000, 1)
    u = counter_uniform(row_seeds(torch.Generator().manual_seed(1), 20000, torch.device("cpu")), 0)
    drawn = sample_rows(logits, u, 1.0, 1.0)
    freq = torch.bincount(drawn, minlength=4).float() / 20000
    torch.testing.assert_close(freq, torch.softmax(logits[0], -1), atol=0.015, rtol=0)
    # Probs 0.64, 0.24, 0.09, 0.03: top_p 0.9 keeps three (renormalised), 0.1 keeps one.
    kept = torch.bincount(sample_rows(logits, u, 1.0, 0.9), minlength=4).float() / 20000
    assert kept[0] == 0 and abs(float(kept[1]) - 0.64 / 0.97) < 0.015
    assert (sample_rows(logits, u, 1.0, 0.1) == 1).all()
    assert torch.equal(sample_rows(logits, u, 0.0, 0.5), logits.argmax(-1))
    # Zero-probability tokens are never drawn, even at u close to 1.
    masked = torch.tensor([[0.0, float("-inf"), 0.0, float("-inf")]]).repeat(3, 1)
    edge = sample_rows(masked, torch.tensor([0.0, 0.5, 1 - 2**-24]), 1.0, 1.0)
    assert edge.tolist() == [0, 2, 2]
    with pytest.raises(ValueError, match="top_p"):
        sample_rows(logits, u, 1.0, 1.5)


def _first_exceeding(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The inverse CDF by definition: the first entry whose running sum exceeds u * total."""
    cdf = probs.cumsum(-1)
    return (cdf <= (u * cdf[:, -1])[:, None]).sum(-1)


@pytest.mark.parametrize("vocab", [100, 1024, 3 * 1024, 5000])
def test_two_level_inverse_cdf_draws_what_one_cumulative_sum_draws(vocab):
    block = sampling.CDF_BLOCK
    gen = torch.Generator().manual_seed(vocab)
    # Small integer masses: every partial sum is exact in fp32 in any grouping, so the two
    # levels must give the definition's entry exactly, boundaries included.
    probs = torch.randint(0, 4, (64, vocab), generator=gen).float()
    probs[:8, : min(block, vocab - 1)] = 0  # whole empty blocks
    probs[8:16, block - 1 :: block] = 0  # empty entries on block edges
    probs[16:, -1] = 0  # a zero-mass last entry (where a clamp would land)
    probs[:, 0] += 1  # every row has mass
    u = torch.rand(64, generator=gen)
    u[:4] = 0.0
    u[4:8] = 1 - 2**-24
    # targets exactly on running-sum boundaries
    u[40:] = torch.randint(0, 50, (24,), generator=gen) / probs[40:].sum(-1)
    got = sampling._inverse_cdf(probs.clone(), u)
    assert torch.equal(got, _first_exceeding(probs, u))
    assert (probs.gather(-1, got[:, None]) > 0).all()  # zero mass is never drawn


def test_inverse_cdf_falls_back_to_the_last_entry_with_mass_when_rounding_overshoots():
    probs = torch.zeros(2, 3000)
    probs[:, 5] = probs[:, 1500] = 1.0
    # u >= 1 stands in for a target rounded up to (or past) the total
    assert sampling._inverse_cdf(probs, torch.tensor([1.0, 1.5])).tolist() == [1500, 1500]


def test_roofline_arithmetic():
    # 2 prompts of 100 and 50 prefix tokens, G = 4, 3 steps: each step reads both prefixes
    # once (150) and 8 rows read 1, 2, 3 own tokens -> 3 * 150 + 8 * 6 = 498 entries.
    assert kv_token_reads([100, 50], 4, 3) == 498
    assert kv_bytes_per_token(layers=2, kv_heads=4, head_dim=8, dtype_bytes=2) == 256
    # 1 MB of weights + 498 * 256 B of K/V over 3 steps in 3 ms, at 1 GB/s peak.
    report = roofline(10**6, 498, 256, 3, 3e-3, 1e9)
    per_step = 10**6 + 498 * 256 / 3
    assert report.bytes_per_step == pytest.approx(per_step)
    assert report.step_seconds == pytest.approx(1e-3)
    assert report.efficiency == pytest.approx(per_step / 1e-3 / 1e9)
    with pytest.raises(ValueError, match="steps"):
        roofline(1, 0, 1, 0, 1.0, 1.0)


def test_lm_weight_bytes_counts_layers_norm_and_head(model, spec):
    h, inter, layers = spec.hidden_size, spec.intermediate_size, spec.num_layers
    kv = spec.num_kv_heads * (h // spec.num_heads)
    attn = h * h + h + 2 * (h * kv + kv) + h * h  # q (bias), k and v (bias), o
    per_layer = attn + 3 * h * inter + 2 * h  # MLP, two norms
    params = layers * per_layer + h + spec.vocab_size * h  # final norm, LM head
    assert lm_weight_bytes(model) == 4 * params


@pytest.mark.parametrize(("temperature", "top_p"), [(0.0, 1.0), (0.7, 1.0), (1.0, 0.8)])
def test_draw_scores_its_token_as_token_logprobs(temperature, top_p):
    logits = torch.randn(16, 50, generator=torch.Generator().manual_seed(2)) * 3
    u = counter_uniform(row_seeds(torch.Generator().manual_seed(3), 16, torch.device("cpu")), 5)
    token, logprob = draw(logits, u, temperature, top_p)
    torch.testing.assert_close(logprob, token_logprobs(logits, token, temperature))
    assert torch.equal(token, sample_rows(logits, u, temperature, top_p))
