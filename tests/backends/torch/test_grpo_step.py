"""Whole GRPO steps through the engine, as an executor would call it: the prefix-sharing
schedule and the verl-style one (prefix recomputed per sample) end with the same weights."""

from __future__ import annotations

import torch

from rollplex.backends.torch.decode import decode
from rollplex.backends.torch.full_forward import full_logprobs
from rollplex.backends.torch.logprob import response_logprobs, response_mask
from rollplex.backends.torch.loss import group_advantages, grpo_loss
from rollplex.backends.torch.model import build_model, set_trainable
from rollplex.engine.prefix import expand_prefix, prefix_forward, vision_encode

G, R, STEPS = 3, 4, 2


def _step(policy, ref, batch, eos, seed, shared: bool) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        feats = vision_encode(policy, batch.pixel_values, batch.image_grid_thw)
        state = expand_prefix(prefix_forward(policy, batch, feats, grad=False), G)
        gen = torch.Generator().manual_seed(seed)
        tokens, old, lengths = decode(policy, state, R, 1.0, 1.0, gen, eos_id=eos)
        if shared:
            ref_feats = vision_encode(ref, batch.pixel_values, batch.image_grid_thw)
            ref_state = expand_prefix(prefix_forward(ref, batch, ref_feats, grad=False), G)
            ref_lp = response_logprobs(ref, ref_state, tokens, lengths)
        else:
            ref_lp = full_logprobs(ref, batch, tokens, lengths, G)
    # A stand-in verifiable reward that a random policy already earns half the time.
    rewards = (tokens[:, 0] % 2).float()
    if shared:
        feats = vision_encode(policy, batch.pixel_values, batch.image_grid_thw)
        state = expand_prefix(prefix_forward(policy, batch, feats, grad=True), G)
        logp = response_logprobs(policy, state, tokens, lengths)
    else:
        logp = full_logprobs(policy, batch, tokens, lengths, G)
    adv = group_advantages(rewards, G)
    mask = response_mask(lengths, R)
    loss, metrics = grpo_loss(logp, old, ref_lp, adv, mask, clip_eps=0.2, kl_coef=0.05)
    loss.backward()
    return metrics


def test_shared_prefix_and_serial_steps_agree(spec, batch):
    eos = spec.special_tokens.eos_token_id
    ref = build_model(spec, seed=1)
    finals = []
    for shared in (True, False):
        policy = build_model(spec, seed=0)
        set_trainable(policy, spec)
        opt = torch.optim.SGD([p for p in policy.parameters() if p.requires_grad], lr=0.5)
        start = {n: p.detach().clone() for n, p in policy.named_parameters()}
        for step in range(STEPS):
            opt.zero_grad(set_to_none=True)
            metrics = _step(policy, ref, batch, eos, seed=step, shared=shared)
            assert torch.isfinite(metrics["loss"]) and metrics["kl"] > 0
            # Decode's logprobs are the policy's: before the update the ratio is 1.
            torch.testing.assert_close(metrics["ratio_mean"], torch.tensor(1.0), atol=1e-5, rtol=0)
            opt.step()
        moved = [n for n, p in policy.named_parameters() if not torch.equal(p, start[n])]
        assert moved and not any(
            n.startswith("model.visual.") and ".merger." not in n for n in moved
        )  # the frozen tower stayed put, the merger and LLM moved
        assert any(".merger." in n for n in moved)
        finals.append({n: p.detach() for n, p in policy.named_parameters()})
    for name, p in finals[0].items():
        torch.testing.assert_close(p, finals[1][name], atol=1e-6, rtol=0, msg=name)
