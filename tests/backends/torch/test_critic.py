"""PPO's critic: its own copy of the LM with a value head; values on the shared prefix
equal those of a full forward per sample; the value loss trains the critic, not the policy."""

from __future__ import annotations

import torch

from rollplex.backends.torch.critic import TorchCritic, build_critic_model
from rollplex.backends.torch.logprob import response_mask
from rollplex.backends.torch.rows import text_only, text_repeat
from rollplex.backends.torch.values import Features, Responses
from rollplex.engine.prefix import vision_encode
from rollplex.specs import AlgoSpec

G = 3
LENGTHS = torch.tensor([5, 1, 3, 4, 2, 5])


def _responses(spec) -> Responses:
    gen = torch.Generator().manual_seed(7)
    raw = torch.randint(7, spec.vocab_size, (len(LENGTHS), int(LENGTHS.max())), generator=gen)
    pad = spec.special_tokens.pad_token_id
    return Responses(torch.where(response_mask(LENGTHS, raw.shape[1]), raw, pad), LENGTHS)


def _critic(model, spec) -> TorchCritic:
    return TorchCritic(build_critic_model(model, spec, seed=0), spec, AlgoSpec(name="ppo"))


def test_critic_is_a_copy_with_a_value_head(model, spec):
    critic = _critic(model, spec)
    assert critic.model.lm_head.weight.shape == (1, spec.hidden_size)
    assert critic.model.model.visual is model.model.visual  # frozen tower shared
    lm = critic.model.model.language_model
    assert lm is not model.model.language_model
    for a, b in zip(lm.parameters(), model.model.language_model.parameters(), strict=True):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    again = build_critic_model(model, spec, seed=0).lm_head.weight
    assert torch.equal(again, critic.model.lm_head.weight)  # seeded head


def test_shared_prefix_values_equal_full_forward(model, batch, spec):
    critic = _critic(model, spec)
    responses = _responses(spec)
    with torch.no_grad():
        feats = vision_encode(model, batch.pixel_values, batch.image_grid_thw)
    tokens = [int(n) // 4 for n in batch.image_grid_thw.prod(-1).tolist()]
    prefix = critic.scorer.logprob_prefix(Features(feats, tokens), text_only(batch))
    shared = critic.scorer.logprob_response(prefix, responses, G)
    per_sample = Features(feats, tokens).repeat(G)
    full = critic.scorer.logprob(per_sample, text_repeat(text_only(batch), G), responses)
    valid = response_mask(LENGTHS, responses.tokens.shape[1])
    assert torch.equal(shared.mask, valid) and (shared.values[~valid] == 0).all()
    assert shared.values[valid].abs().min() > 0
    torch.testing.assert_close(shared.values, full.values, atol=1e-5, rtol=0)


def test_value_loss_trains_the_critic_only(model, batch, spec):
    critic = _critic(model, spec)
    responses = _responses(spec)
    with torch.no_grad():
        feats = vision_encode(model, batch.pixel_values, batch.image_grid_thw)
    tokens = [int(n) // 4 for n in batch.image_grid_thw.prod(-1).tolist()]
    text = text_only(batch)
    old = critic.scorer.logprob_response(
        critic.scorer.logprob_prefix(Features(feats, tokens), text), responses, G
    )
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0])
    _, returns = critic.advantages(rewards, old, gamma=1.0, lam=0.95)
    head = critic.model.lm_head.weight.detach().clone()
    policy = [p.detach().clone() for p in model.parameters()]
    losses = []
    for _ in range(3):
        state, _ = critic.trainer.logprob_prefix(Features(feats, tokens), text)
        values, saved = critic.trainer.logprob_response(state, responses, G)
        assert list(saved.tensors())  # what backward keeps is accounted
        loss = critic.loss(values, returns, old, clip=10.0)
        losses.append(float(loss.value.detach()))
        critic.optimizer_step(critic.backward(loss))
    assert losses[-1] < losses[0]
    assert critic.counter.n == 3 and not torch.equal(head, critic.model.lm_head.weight)
    assert all(torch.equal(a, b) for a, b in zip(policy, model.parameters(), strict=True))
